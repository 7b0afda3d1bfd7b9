"""Several views of one image, each from its own pipeline, out of one planned decode.

Self-supervised recipes (DINO, SwAV, iBOT, BYOL) train on several crops of each image,
e.g. DINO's 2 global crops at 224 and 8 local crops at 96. Decoding the image once per
view would cost 10 decodes; :class:`MultiView` draws every view's crop from the header
first, then decodes once, as cheaply as serves all of them (a DCT scale every crop still
has enough pixels at, or the region of their union box: :meth:`Planner.choose
<fastload.decode.plan.Planner.choose>`), and cuts each view out of that decode.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from ..decode import Decoder, ImageHeader, check_pixels, read_header
from ..decode.libjpeg import scaled_size, scratch
from ..decode.plan import DecodePlan, choose
from ..decode.resize import Crop
from .compose import Compose, DecodePipeline, compose_of


@dataclass(frozen=True)
class ViewSteps:
    """What :meth:`MultiView.plan_decode` decided for one encoded image.

    Attributes:
        header: The image's header.
        crops: Each view's crop, in view order; None for a view whose pipeline has no
            leading crop planner (it gets the whole image).
        plan: The one decode serving every crop (TurboJPEG JPEGs whose views all have a
            crop), or None (a full decode, or the decoder's power-of-2 scale).
    """

    header: ImageHeader
    crops: tuple[Crop | None, ...]
    plan: DecodePlan | None

    @property
    def crop(self) -> None:
        """No single crop (a :class:`~fastload.transforms.DecodeSteps` has one): see ``crops``."""
        return None

    @property
    def region(self) -> tuple[int, int, int, int] | None:
        """(y0, x0, y1, x1) of a planned region decode (the crops' union box), else None."""
        return self.plan.region if self.plan is not None else None


def _counts(counts: Sequence[int] | None, n: int) -> tuple[int, ...]:
    if counts is None:
        return (1,) * n
    if isinstance(counts, (str, bytes)) or not isinstance(counts, Sequence) or len(counts) != n:
        raise ValueError(f"counts must be a sequence of {n} ints (views per pipeline), got {counts!r}")
    for c in counts:
        if isinstance(c, bool) or not isinstance(c, (int, np.integer)) or c < 1:
            raise ValueError(f"counts must be ints >= 1, got {counts!r}")
    return tuple(int(c) for c in counts)


class MultiView(DecodePipeline):
    """Several views of each image, each view from its own pipeline: SSL's multi-crop.

    ``MultiView([global_1, global_2, local], counts=[1, 1, 8])`` makes 10 views of every
    image: one from ``global_1``, one from ``global_2``, then 8 from ``local``. A dataset
    with this transform loads each sample as a tuple of H×W×C uint8 arrays in view order,
    and :class:`fastload.Loader` batches every view on its own, so views of different
    sizes work: ``for views, y in loader`` gives ``views`` as a list of N×C×H×W tensors
    (normalized, channels_last, on the device), ``views[k]`` the k-th view of every image,
    as torchvision's ``default_collate`` batches a list of views.

    Each pipeline should start with a crop planner (``RandomResizedCrop``, ``Resize``,
    ``Resize`` + ``CenterCrop``). All views' crops are drawn first, in view order, from the
    sample's generator; the image is then decoded once, at the cheapest plan that serves
    every crop (a view without a crop planner takes the whole image, so the decode is
    full); each view is cut out of it and resized, then its pipeline's later transforms
    run (view order, same generator). So the views are reproducible from (seed, epoch,
    index), and ``MultiView(...)(img, rng)`` on a decoded image draws what a planned
    decode draws.

    Args:
        pipelines: One pipeline per kind of view: a :class:`Compose`, a list of transforms,
            or a single transform (a pipeline of one).
        counts: Views each pipeline makes, in order (default: one each).
        reduced_decode: Let the decode be DCT-scaled (or fast-upsampled) when every crop
            allows it; also off when a pipeline's ``reduced_decode`` is off.

    Raises:
        TypeError: ``pipelines`` is not a non-empty list, or holds a MultiView or a
            non-callable.
        ValueError: ``counts`` is not one int >= 1 per pipeline.

    Example::

        views = fl.transforms.MultiView(
            [fl.transforms.train(224, scale=(0.4, 1)), fl.transforms.train(96, scale=(0.05, 0.4))],
            counts=[2, 6])
        for (g1, g2, *local), y in fl.Loader(fl.ImageFolder(root, transform=views), batch_size=64):
            ...
    """

    def __init__(
        self, pipelines: Sequence[Any], counts: Sequence[int] | None = None, reduced_decode: bool = True
    ) -> None:
        if not isinstance(pipelines, (list, tuple)) or not pipelines:
            raise TypeError(
                f"pipelines must be a non-empty list of pipelines (Compose or lists of transforms), got {pipelines!r}"
            )
        for p in pipelines:
            if isinstance(p, MultiView):
                raise TypeError(f"a MultiView cannot hold another MultiView, got {p!r}; list its pipelines instead")
        self.pipelines: tuple[Compose, ...] = tuple(compose_of(p) for p in pipelines)
        self.counts = _counts(counts, len(self.pipelines))
        self.reduced_decode = bool(reduced_decode)  # as given: each pipeline's own is read as it plans
        self._per_view = tuple(p for p, c in zip(self.pipelines, self.counts) for _ in range(c))

    @property  # read-only where a Compose's is a list to change: set ``pipelines`` instead
    def transforms(self) -> tuple[Compose, ...]:  # type: ignore[override]
        """The pipelines (what a Compose's ``transforms`` is to a single view), a tuple: set
        ``pipelines`` to change them."""
        return self.pipelines

    def _reduced(self) -> bool:
        """Whether the decode may be reduced: this MultiView's ``reduced_decode`` and every
        pipeline's (read as it plans: a pipeline's set in place counts)."""
        return self.reduced_decode and all(p.reduced_decode for p in self.pipelines)

    @property
    def num_views(self) -> int:
        """Views per image."""
        return len(self._per_view)

    def plan(self, h: int, w: int, rng: np.random.Generator) -> tuple[Crop | None, ...]:
        """Each view's crop of an h×w image, drawn from ``rng`` in view order."""
        return tuple(p.plan(h, w, rng) for p in self._per_view)

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
        """The views of a decoded image (the draws of :meth:`decode`, in the same order)."""
        h, w = img.shape[:2]
        crops = self.plan(h, w, rng)
        return tuple(
            p.after_crop(img if c is None else c.apply(img, h, w), rng, None, c is not None)
            for p, c in zip(self._per_view, crops)
        )

    def plan_decode(
        self,
        data: Any,
        decoder: Decoder,
        rng: np.random.Generator,
        max_pixels: int | None = None,
        *,
        verified: bool = False,
    ) -> ViewSteps:
        """The first half of :meth:`decode`: the header read and checked against the pixel
        limit, every view's crop drawn from ``rng`` and, for TurboJPEG, the one decode planned
        (arguments as :meth:`Compose.plan_decode`)."""
        header = read_header(data)
        check_pixels(header, max_pixels)
        crops = self.plan(header.height, header.width, rng)
        planned = None
        if all(c is not None for c in crops) and decoder.scales and header.format == "jpeg" and header.components != 4:
            planned = choose(header, cast(tuple[Crop, ...], crops), self._reduced(), verified)
        return ViewSteps(header, crops, planned)

    def finish_decode(
        self,
        data: Any,
        decoder: Decoder,
        steps: ViewSteps,
        rng: np.random.Generator,
        out: Sequence[np.ndarray] | None = None,
        max_pixels: int | None = None,
        pixels: np.ndarray | None = None,
    ) -> tuple[np.ndarray, ...]:
        """The second half of :meth:`decode`: one decode as ``steps`` planned (``pixels``: the
        planned region, already decoded by a batched call), then each view's crop, resize and
        later transforms, into its row of ``out`` (one array per view) where it can."""
        header, crops, planned = steps.header, steps.crops, steps.plan
        h, w = header.height, header.width
        buf, scale, origin = None, None, (0, 0)
        if planned is not None:
            scale, origin = float(planned.scale), planned.origin
            if pixels is not None:
                img = pixels
            else:
                if planned.region is None:  # decoded into this thread's scratch: nothing may point into it after
                    buf = scratch(math.prod(scaled_size(header, planned.scale)) * 3)
                img = planned.decode(data, decoder, header, max_pixels, buf)
        else:
            cropped = [c for c in crops if c is not None]
            reduce = self._reduced() and len(cropped) == len(crops)
            img = decoder.decode(
                data, max(c.decode_scale for c in cropped) if reduce else 1.0, header=header, max_pixels=max_pixels
            )
        outs = tuple(out) if out is not None else (None,) * len(crops)
        views = []
        for pipeline, crop, dst in zip(self._per_view, crops, outs):
            view = img
            if crop is not None:
                direct = dst is not None and dst.shape == (crop.out_h, crop.out_w, img.shape[2])
                view = crop.apply(img, h, w, dst if direct else None, scale, origin)
                if buf is not None and view is not dst and np.may_share_memory(view, buf):
                    view = view.copy()  # a crop of the whole image at its size: the scratch is reused next
            views.append(pipeline.after_crop(view, rng, dst, crop is not None))
        return tuple(views)

    def decode(
        self,
        data: Any,
        decoder: Decoder,
        rng: np.random.Generator,
        out: Sequence[np.ndarray] | None = None,
        max_pixels: int | None = None,
    ) -> tuple[np.ndarray, ...]:
        """Decodes ``data`` once, as every view's crop allows, and makes the views (a tuple of
        H×W×C uint8 arrays, in view order). :meth:`plan_decode` and :meth:`finish_decode` are
        its two halves; arguments as :meth:`Compose.decode`, ``out`` one array per view."""
        steps = self.plan_decode(data, decoder, rng, max_pixels)
        return self.finish_decode(data, decoder, steps, rng, out, max_pixels)

    def __repr__(self) -> str:
        return f"MultiView([{', '.join(map(repr, self.pipelines))}], counts={list(self.counts)})"
