"""The tutorial's Keras CIFAR-10 CNN (``cifar10_cnn.py``) with Horovod's changes, on Keras 3.

    ringtrain run -np 2 python examples/keras_cifar_cnn.py --epochs 4   # Fashion-MNIST, minutes
    ringtrain run -np 2 python examples/keras_cifar_cnn.py --epochs 4 --data DIR  # image folders
    ringtrain run --horovod-compat -np 2 python examples/keras_cifar_cnn.py --epochs 4 --hvd horovod

(The tutorial's 100 epochs, the default, take hours on a CPU.)

The script is the tutorial's, with exactly the changes its Horovod version makes (marked
"Horovod:"): ``hvd.init()``, epochs divided by the number of workers, the learning rate times
``hvd.size()``, ``hvd.DistributedOptimizer``, ``BroadcastGlobalVariablesCallback(0)``, and
checkpoints on rank 0 only. As in the tutorial every worker trains on the whole training set,
in its own random order. Ported to Keras 3 (see docs/keras.md): ``RMSprop(learning_rate=...)``
with Keras 2's ``decay`` as an ``InverseTimeDecay`` schedule, ``ImageDataGenerator``'s shifts
and flips as preprocessing layers, ``fit`` instead of ``fit_generator``, and ``.keras`` files.
The data: Fashion-MNIST padded to 32x32x3 (grey copied to three channels), or any image folder.
Rank 0 saves ``model.keras`` and ``model.json`` (what ``ringtrain serve`` reads) in the outputs.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import math
import os
import time
from pathlib import Path

import numpy as np

SIZE = 32


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; the only place this example reads environment variables."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", default="fashion",
                   help="'fashion' (Fashion-MNIST from --fashion-dir) or an image folder with "
                        "train/ and val/ of one sub-folder per class")
    p.add_argument("--fashion-dir", type=Path, default=Path("/usr/share/datasets/fashion-mnist"))
    p.add_argument("--epochs", type=int, default=100,
                   help="epochs of ONE worker (the tutorial's 100); N workers run ceil(epochs/N)")
    p.add_argument("--batch-size", type=int, default=32, help="examples per worker per step")
    p.add_argument("--lr", type=float, default=1e-4,
                   help="RMSprop learning rate of one worker (the tutorial's 1e-4), times size")
    p.add_argument("--no-augmentation", action="store_true",
                   help="train without the random shifts and flips")
    p.add_argument("--limit-train", type=int, default=0, help="first N training images (0: all)")
    p.add_argument("--limit-val", type=int, default=0, help="first N test images (0: all)")
    p.add_argument("--seed", type=int, default=0, help="seed of weights, shuffling, augmentation")
    p.add_argument("--output-dir", type=Path,
                   default=Path(os.environ.get("RINGTRAIN_OUTPUT_MODEL") or "saved_models"),
                   help="where rank 0 writes checkpoints and the model "
                        "(env RINGTRAIN_OUTPUT_MODEL)")
    p.add_argument("--hvd", choices=["ringtrain", "horovod"], default="ringtrain",
                   help="import ringtrain.keras, or horovod.keras (under --horovod-compat)")
    args = p.parse_args(argv)
    if args.epochs < 1 or args.batch_size < 1 or args.lr <= 0:
        p.error("--epochs, --batch-size and --lr must be positive")
    return args


def fashion_mnist(data_dir: Path):
    """Fashion-MNIST as the tutorial's CIFAR-10 arrays: 32x32x3 uint8 images, integer labels."""
    from ringtrain.data.fashion_mnist import CLASSES, load_fashion_mnist

    def split(name):
        images, labels = load_fashion_mnist(name, data_dir)
        x = np.pad(images.numpy(), ((0, 0), (2, 2), (2, 2)))  # 28x28 -> 32x32, zero border
        return np.repeat(x[..., None], 3, axis=-1), labels.numpy()[:, None]

    return split("train"), split("test"), list(CLASSES)


def image_folders(root: Path):
    """``root/train`` and ``root/val`` read into 32x32x3 uint8 arrays (needs Pillow)."""
    from PIL import Image

    from ringtrain.data.image_folder import ImageFolder

    def split(name, classes=None):
        folder = ImageFolder(root / name)
        if classes is not None and folder.classes != classes:
            raise SystemExit(f"keras_cifar_cnn: {root}/train and {root}/{name} have different "
                             "classes")
        images = [np.asarray(Image.open(path).convert("RGB").resize((SIZE, SIZE)))
                  for path, _ in folder.samples]
        labels = np.array([[label] for _, label in folder.samples])
        return (np.stack(images), labels), folder.classes

    train, classes = split("train")
    test, _ = split("val", classes)
    return train, test, classes


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    # Horovod: import horovod.keras as hvd (ringtrain.keras picks Keras' torch backend, or
    # the one KERAS_BACKEND names: tensorflow or jax)
    hvd = importlib.import_module(f"{args.hvd}.keras")
    import keras

    # Horovod: initialize Horovod.
    hvd.init()
    # (Horovod pins a GPU with tf.ConfigProto / K.set_session; Keras 3 needs neither: see
    # docs/keras.md. torch is there on every backend: it is ringtrain's engine.)
    import torch

    if torch.cuda.is_available():
        torch.cuda.set_device(hvd.local_rank())
    keras.utils.set_random_seed(args.seed + hvd.rank())

    batch_size = args.batch_size
    # Horovod: adjust number of epochs based on number of GPUs.
    epochs = int(math.ceil(args.epochs / hvd.size()))  # noqa: RUF046 - the tutorial's line
    data_augmentation = not args.no_augmentation
    save_dir = args.output_dir

    # The data, split between train and test sets:
    if args.data == "fashion":
        (x_train, y_train), (x_test, y_test), classes = fashion_mnist(args.fashion_dir)
    else:
        (x_train, y_train), (x_test, y_test), classes = image_folders(Path(args.data))
    if args.limit_train:
        x_train, y_train = x_train[:args.limit_train], y_train[:args.limit_train]
    if args.limit_val:
        x_test, y_test = x_test[:args.limit_val], y_test[:args.limit_val]
    num_classes = len(classes)
    if hvd.rank() == 0:
        print("x_train shape:", x_train.shape)
        print(x_train.shape[0], "train samples")
        print(x_test.shape[0], "test samples")

    # Convert class vectors to binary class matrices.
    y_train = keras.utils.to_categorical(y_train, num_classes)
    y_test = keras.utils.to_categorical(y_test, num_classes)

    # ImageDataGenerator(width_shift_range=0.1, height_shift_range=0.1, horizontal_flip=True)
    # in Keras 3: preprocessing layers, active in training only.
    augmentation = [keras.layers.RandomTranslation(0.1, 0.1, fill_mode="nearest"),
                    keras.layers.RandomFlip("horizontal")] if data_augmentation else []
    model = keras.Sequential([
        keras.Input(x_train.shape[1:]),
        *augmentation,
        keras.layers.Conv2D(32, (3, 3), padding="same"),
        keras.layers.Activation("relu"),
        keras.layers.Conv2D(32, (3, 3)),
        keras.layers.Activation("relu"),
        keras.layers.MaxPooling2D(pool_size=(2, 2)),
        keras.layers.Dropout(0.25),
        keras.layers.Conv2D(64, (3, 3), padding="same"),
        keras.layers.Activation("relu"),
        keras.layers.Conv2D(64, (3, 3)),
        keras.layers.Activation("relu"),
        keras.layers.MaxPooling2D(pool_size=(2, 2)),
        keras.layers.Dropout(0.25),
        keras.layers.Flatten(),
        keras.layers.Dense(512),
        keras.layers.Activation("relu"),
        keras.layers.Dropout(0.5),
        keras.layers.Dense(num_classes),
        keras.layers.Activation("softmax"),
    ])

    # Horovod: adjust learning rate based on number of GPUs.
    # (Keras 2's rmsprop(lr=..., decay=1e-6): lr / (1 + 1e-6 * iterations).)
    opt = keras.optimizers.RMSprop(learning_rate=keras.optimizers.schedules.InverseTimeDecay(
        args.lr * hvd.size(), decay_steps=1, decay_rate=1e-6))

    # Horovod: add Horovod Distributed Optimizer.
    opt = hvd.DistributedOptimizer(opt)

    # Let's train the model using RMSprop
    model.compile(loss="categorical_crossentropy", optimizer=opt, metrics=["accuracy"])

    x_train = x_train.astype("float32") / 255
    x_test = x_test.astype("float32") / 255

    callbacks = [
        # Horovod: broadcast initial variable states from rank 0 to all other processes.
        # This is necessary to ensure consistent initialization of all workers when
        # training is started with random weights or restored from a checkpoint.
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    ]
    # Horovod: save checkpoints only on worker 0 to prevent other workers from corrupting them.
    if hvd.rank() == 0:
        save_dir.mkdir(parents=True, exist_ok=True)
        checkpoints = str(save_dir / "checkpoint-{epoch}.keras")
        callbacks.append(keras.callbacks.ModelCheckpoint(checkpoints))
        # ringtrain: training curves for the job service's dashboard (Keras' TensorBoard
        # callback needs TensorFlow; this one writes the same event files without it).
        if importlib.util.find_spec("tensorboard") is not None:
            from ringtrain.keras.callbacks import TensorBoard

            callbacks.append(TensorBoard(str(save_dir / "tb")))
        else:
            print("training curves off: `pip install tensorboard` to log them", flush=True)

    fit_started = time.perf_counter()
    model.fit(x_train, y_train, batch_size=batch_size, epochs=epochs,
              validation_data=(x_test, y_test), shuffle=True, callbacks=callbacks,
              verbose=2 if hvd.rank() == 0 else 0)
    fit_seconds = time.perf_counter() - fit_started

    # Save model and weights
    if hvd.rank() == 0:
        model_path = save_dir / "model.keras"
        model.save(model_path)
        (save_dir / "model.json").write_text(json.dumps({
            "arch": "keras", "task": "classification", "classes": classes,
            "input_shape": [x_train.shape[3], SIZE, SIZE], "mean": [0.0], "std": [1.0],
            "extra": {"outputs": "probabilities", "epochs": epochs, "world_size": hvd.size()},
        }, indent=2))
        print(f"Saved trained model at {model_path}")

    # Score trained model.
    scores = model.evaluate(x_test, y_test, verbose=0)
    if hvd.rank() == 0:
        print("Test loss:", scores[0])
        print("Test accuracy:", scores[1])
        print(json.dumps({"example": "keras_cifar_cnn", "backend": keras.backend.backend(),
                          "world_size": hvd.size(),
                          "epochs": epochs, "train_images": int(x_train.shape[0]),
                          "test_loss": round(float(scores[0]), 4),
                          "test_accuracy": round(float(scores[1]), 4),
                          "fit_seconds": round(fit_seconds, 1),
                          # every worker passes over the whole training set each epoch
                          "images_per_second": round(
                              epochs * x_train.shape[0] * hvd.size() / fit_seconds, 1),
                          "seconds": round(time.perf_counter() - started, 1)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
