"""ringtrain.data: data sets, input pipelines and the `ringtrain data` commands.

Readers: ``idx`` (IDX files), ``fashion_mnist``, ``image_folder`` (ImageNet layout), ``coco``
(COCO detection sets: encoded bytes + targets for the pipeline, decoded images for torchvision's
detectors), ``packed`` (the pre-resized memory-mapped format), ``voc`` (Pascal VOC
boxes). Writers: ``coco_builder``, ``tiling``. The pipeline: ``sharding`` (per-rank sampler),
``jpeg`` and ``gpu_decode`` (decoders), ``crop``, ``normalize``, ``augment``, ``classification``,
``box_transforms`` and ``detection`` (COCO samples augmented with their boxes),
``loader`` (device prefetch) and ``tuning`` (workers and depth). ``synthetic`` makes fixed random
batches. Import the module you need; this package imports nothing.
"""
