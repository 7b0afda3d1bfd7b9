"""What a stream that plans its records shares: ``decode(record)`` is ``finish(plan_record(record))``.

A stream's record carries (or reads) its encoded image; :meth:`PlannedRecords.plan_record`
reads it, checks its header, draws its crop with the sample's generator and chooses the
decode (:class:`~fastload.datasets.sampleplan.SamplePlan`); :meth:`PlannedRecords.finish`
decodes, resizes and transforms it. Between the two a batch source decodes the regions of a
batch in one call (:mod:`fastload.sources.batchplan`), as it does for an indexed dataset.
Every plan is as strict as a full decode (:mod:`fastload.decode.plan`), but for a record
whose bytes have the checksum a converter's strict verification recorded
(:meth:`PlannedRecords.record_verified`, :mod:`fastload.verified`): that one may take the
cheapest plan its crop allows (a region decode).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..decode import DecodeError, get_decoder
from ..verified import ChangedSinceVerifiedError
from .base import HoldsPipeline, sample_rng
from .sampleplan import SamplePlan


class PlannedRecords(HoldsPipeline):
    """A mixin for streams: records planned and finished as an ImageDataset's samples are.

    The stream sets ``transform``, ``decoder`` and ``max_pixels`` and implements
    :meth:`record_bytes`.
    """

    transform: Any
    decoder: str | None
    max_pixels: int | None
    #: As an ImageDataset's: class names where the records' metadata stores them, else None.
    classes: list[str] | None = None
    #: As an ImageDataset's: None, a stream's samples are records, not files.
    paths: None = None

    def record_bytes(self, record: Any) -> Any:
        """The encoded image of ``record`` (raises what keeps it from being read)."""
        raise NotImplementedError

    def record_verified(self, record: Any, data: Any) -> bool:
        """Whether ``record``'s image ``data`` was verified strictly before (False: never, by
        default; streams that record checksums override it).

        Raises:
            ChangedSinceVerifiedError: Its checksum no longer matches the verified one.
        """
        return False

    def plan_record(self, record: Any, epoch: int, seed: int) -> SamplePlan:
        """``record``'s image read, its header checked, its crop drawn with the generator of
        (seed, epoch, record number) and its decode chosen; its target is not read (``label`` None).

        Raises:
            Exception: ``record.error`` (it could not be read), or what reading its image raises.
            ChangedSinceVerifiedError: Its bytes changed since they were verified (refused
                before anything decodes them).
            DecodeError: The header is unreadable or over the pixel limit.
        """
        if record.error is not None:
            raise record.error
        data = self.record_bytes(record)
        return self.plan_bytes(int(record.number), data, epoch, seed, self.record_verified(record, data))

    def plan_bytes(self, number: int, data: Any, epoch: int, seed: int, verified: bool) -> SamplePlan:
        """Record ``number``'s image ``data`` (read already, ``verified`` or not) planned as
        :meth:`plan_record` plans it: the device plans a row its decoder refused again from the
        bytes its batch carries (a stream cannot read a record twice).

        Raises:
            DecodeError: The header is unreadable or over the pixel limit.
        """
        rng = sample_rng(seed, epoch, number)
        if verified:
            steps = self.transform.plan_decode(data, get_decoder(self.decoder), rng, self.max_pixels, verified=True)
        else:
            steps = self.transform.plan_decode(data, get_decoder(self.decoder), rng, self.max_pixels)
        return SamplePlan(number, data, None, rng, steps, verified)

    def finish(self, plan: SamplePlan, pixels: np.ndarray | None = None, out: np.ndarray | None = None) -> np.ndarray:
        """Decodes, resizes and transforms a planned record (into ``out`` when it can);
        ``pixels``: its planned region, already decoded.

        Raises:
            DecodeError: The bytes are not a decodable image.
        """
        decoder = get_decoder(self.decoder)
        return self.transform.finish_decode(plan.data, decoder, plan.steps, plan.rng, out, self.max_pixels, pixels)

    def decode(self, record: Any, epoch: int, seed: int, *, out: np.ndarray | None = None) -> np.ndarray:
        """Decodes and transforms ``record`` with the rng of (seed, epoch, record.number).

        Raises:
            DecodeError: The image does not decode (the message names ``record.where``).
            Exception: ``record.error``, for a record that could not be read.
        """
        try:
            return self.finish(self.plan_record(record, epoch, seed), out=out)
        except ChangedSinceVerifiedError:
            raise  # names its record already, and keeps its type for on_error
        except DecodeError as e:
            raise DecodeError(f"{self.record_name(record)}: {e}") from e

    def record_name(self, record: Any) -> str:
        """How :meth:`decode`'s errors name ``record``."""
        return f"record {record.number} ({record.where})"
