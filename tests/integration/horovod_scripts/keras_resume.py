"""The checkpoint and resume of Horovod's Keras ImageNet example (keras_imagenet_resnet50.py),
its Horovod lines unchanged, on a tiny model: a first run writes checkpoint-<epoch>.keras on
rank 0; a run with more epochs resumes from the last one (rank 0 loads it, the others build a
fresh model, the first batch's broadcast makes them equal).

keras is imported before horovod.keras, as in Horovod's example, and KERAS_BACKEND is left
to the launcher. Every rank prints one JSON line.
"""

import argparse
import hashlib
import json
import os

import numpy as np

# isort: off
import keras  # first, as in Horovod's example: the launcher must have chosen the backend
import horovod.keras as hvd
# isort: on

parser = argparse.ArgumentParser()
parser.add_argument("--checkpoint-dir", required=True)
parser.add_argument("--epochs", type=int, required=True)
args = parser.parse_args()

hvd.init()
checkpoint_format = os.path.join(args.checkpoint_dir, "checkpoint-{epoch}.keras")

# If set > 0, will resume training from a given checkpoint.
resume_from_epoch = 0
for try_epoch in range(args.epochs, 0, -1):
    if os.path.exists(checkpoint_format.format(epoch=try_epoch)):
        resume_from_epoch = try_epoch
        break

# Horovod: broadcast resume_from_epoch from rank 0 (which will have checkpoints) to other ranks.
resume_from_epoch = hvd.broadcast(resume_from_epoch, 0, name="resume_from_epoch")

if resume_from_epoch > 0 and hvd.rank() == 0:
    model = hvd.load_model(checkpoint_format.format(epoch=resume_from_epoch))
else:
    keras.utils.set_random_seed(hvd.rank())  # each rank its own initial weights
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(3, activation="softmax")])
    opt = keras.optimizers.SGD(learning_rate=0.01 * hvd.size(), momentum=0.9)
    opt = hvd.DistributedOptimizer(opt)
    model.compile(loss="categorical_crossentropy", optimizer=opt, metrics=["accuracy"])

callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
             hvd.callbacks.MetricAverageCallback()]
if hvd.rank() == 0:
    callbacks.append(keras.callbacks.ModelCheckpoint(checkpoint_format))

rng = np.random.default_rng(hvd.rank())
x = rng.random((32, 8), dtype=np.float32)
y = keras.utils.to_categorical(rng.integers(0, 3, 32), 3)
history = model.fit(x, y, batch_size=8, callbacks=callbacks, epochs=args.epochs, verbose=0,
                    initial_epoch=resume_from_epoch)

weights = hashlib.sha256(b"".join(np.ascontiguousarray(keras.ops.convert_to_numpy(v)).tobytes()
                                  for v in model.trainable_variables)).hexdigest()
print(json.dumps({"rank": hvd.rank(), "backend": keras.backend.backend(),
                  "resume_from_epoch": int(resume_from_epoch),
                  "resume_shape": list(np.shape(resume_from_epoch)), "epochs": history.epoch,
                  "iterations": int(model.optimizer.iterations), "weights": weights}))
