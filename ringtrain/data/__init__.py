"""ringtrain.data: data sets and batches for the examples and benchmarks.

``idx`` reads IDX files, ``fashion_mnist`` the Fashion-MNIST data set, ``augment`` does shifts and
flips on tensors, ``synthetic`` makes fixed random batches; ``voc`` reads Pascal VOC boxes,
``tiling`` cuts annotated photos into tiles, ``coco`` writes COCO annotation files and
``coco_detection`` reads them as a detection data set. Import the module you need; this package
imports nothing.
"""
