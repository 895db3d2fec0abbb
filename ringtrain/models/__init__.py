"""ringtrain.models: single-device reference models; distribution wraps them, never the reverse.

``cifar_cnn`` is the tutorial's small CNN and ``fashion_cnn`` its 28x28 case, ``small_cnn`` one for
colour crops, ``resnet`` torchvision-compatible ResNets, ``vision`` the optional torchvision import
(with its nms fallback) and builders by torchvision's names, ``detection`` RetinaNet on a
MobileNetV2 pyramid, ``saved`` a trained model on disk (weights + metadata) and how to rebuild it.
Import the module you need; this package imports nothing.
"""
