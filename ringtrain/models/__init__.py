"""ringtrain.models: single-device reference models; distribution wraps them, never the reverse.

``fashion_cnn`` is the classic small CNN, ``small_cnn`` one for colour crops, ``resnet``
torchvision-compatible ResNets, ``vision`` the optional torchvision import (with its nms fallback) and builders by torchvision's names.
Import the module you need; this package imports nothing.
"""
