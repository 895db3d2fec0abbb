"""ringtrain.data: data sets and batches for the examples and benchmarks.

``idx`` reads IDX files, ``fashion_mnist`` the Fashion-MNIST data set, ``augment`` does shifts and
flips on tensors, ``synthetic`` makes fixed random batches; ``voc`` reads Pascal VOC boxes,
``tiling`` cuts annotated photos into tiles and ``coco`` writes COCO annotation files. Import the module you need; this
package imports nothing.
"""
