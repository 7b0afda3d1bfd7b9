"""The device stage: host batches → normalized batches on ``loader.device``.

:mod:`.prefetch` copies each batch on one CUDA side stream (per-batch events,
``record_stream``) and normalizes it (:mod:`.normalize`); :mod:`.gpudecode` decodes JPEG
batches on the GPU instead (``decode="gpu"``). The batch augmentations that run after it
(Mixup, CutMix, RandomErasing) are the public :mod:`fastload.augment`.
"""
