"""The device stage: one driver from a source's batches to normalized batches on ``loader.device``.

:mod:`.driver` runs an executor per batch, normalizes (:mod:`.normalize`) and hands each
batch over with one CUDA side stream, per-batch events and ``record_stream``;
:mod:`.copy` is the executor of host batches (the copy), :mod:`.gpudecode` the one of
``decode="gpu"`` (JPEG batches decoded on the GPU, on the driver's threads);
:mod:`.prefetch` is the driver over your own iterable (``fl.CudaPrefetcher``). The batch
augmentations run at the hand-over (Mixup, CutMix, RandomErasing) are the public
:mod:`fastload.augment`.
"""
