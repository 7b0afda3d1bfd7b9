"""Image headers read without decoding pixels: JPEG and PNG parsed here, the rest by Pillow."""

from __future__ import annotations

import io
import re
from dataclasses import dataclass, field

from ._base import Buffer, DecodeError

_JPEG_SOI = b"\xff\xd8"
_PNG_SIG = b"\x89PNG\r\n\x1a\n"
# SOF markers carry the frame size; C4 (DHT), C8 (JPG) and CC (DAC) do not.
_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_PROGRESSIVE_SOF = frozenset({0xC2, 0xC6, 0xCA, 0xCE})
# What ends entropy-coded data: 0xFF then a marker byte. Not FF00 (a stuffed FF), RST0-7
# (restart markers inside a scan) or FFFF (fill bytes before a marker).
_SCAN_END = re.compile(rb"\xff[^\x00\xd0-\xd7\xff]")
# PNG colour type -> channels: grey, RGB, palette, grey + alpha, RGBA.
_PNG_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}


@dataclass(frozen=True)
class ImageHeader:
    """What an image's header says, read once per sample and passed to the decoder.

    Attributes:
        height: Rows of the full-size image.
        width: Columns of the full-size image.
        format: "jpeg", "png", or Pillow's format name in lower case.
        components: Colour channels stored (JPEG: 1 grey, 3 YCbCr or RGB, 4 CMYK or YCCK).
        progressive: A progressive JPEG.
        nbytes: Size of the encoded image in bytes (0: unknown); what a decode's cost
            grows with besides pixels (:mod:`fastload.decode.plan`).
    """

    height: int
    width: int
    format: str
    components: int = 3
    progressive: bool = False
    nbytes: int = field(default=0, compare=False)


def is_jpeg(data: Buffer) -> bool:
    return bytes(data[:2]) == _JPEG_SOI


def read_header(data: Buffer) -> ImageHeader:
    """The header of ``data``, without decoding pixels.

    Raises:
        DecodeError: The bytes do not start like an image, or its header is cut short.
    """
    head = memoryview(data)
    if bytes(head[:2]) == _JPEG_SOI:
        return _jpeg_header(head)
    if bytes(head[:8]) == _PNG_SIG and len(head) >= 26:
        h, w = int.from_bytes(head[20:24], "big"), int.from_bytes(head[16:20], "big")
        if h == 0 or w == 0:
            raise DecodeError(f"PNG header has zero size {w}x{h}")
        return ImageHeader(h, w, "png", _PNG_CHANNELS.get(head[25], 3), nbytes=len(head))
    return _pillow_header(head)


def image_size(data: Buffer) -> tuple[int, int]:
    """(height, width) read from the header, without decoding pixels."""
    header = read_header(data)
    return header.height, header.width


def _jpeg_header(buf: memoryview) -> ImageHeader:
    i, n = 2, len(buf)
    while i + 4 <= n:
        if buf[i] != 0xFF:
            raise DecodeError(f"corrupt JPEG header: no marker at byte {i}")
        marker = buf[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:  # markers without a length
            i += 2
            continue
        if marker in _SOF_MARKERS:
            if i + 10 > n:
                break
            h = (buf[i + 5] << 8) | buf[i + 6]
            w = (buf[i + 7] << 8) | buf[i + 8]
            if h == 0 or w == 0:
                raise DecodeError(f"JPEG frame has zero size {w}x{h}")
            return ImageHeader(h, w, "jpeg", buf[i + 9], marker in _PROGRESSIVE_SOF, n)
        if marker in (0xD9, 0xDA):  # end of image or start of scan before any frame
            break
        i += 2 + ((buf[i + 2] << 8) | buf[i + 3])
    raise DecodeError("truncated or corrupt JPEG header: no frame size found")


def _pillow_header(head: memoryview) -> ImageHeader:
    from PIL import Image

    try:
        # Lazy: Image.open reads the header only. Pillow's own decompression-bomb check
        # (PIL.Image.MAX_IMAGE_PIXELS) runs here too and fails images twice over it.
        with Image.open(io.BytesIO(head)) as img:
            w, h = img.size
            return ImageHeader(h, w, (img.format or "unknown").lower(), len(img.getbands()), nbytes=len(head))
    except Image.DecompressionBombError as e:
        raise DecodeError(f"image over Pillow's limit, PIL.Image.MAX_IMAGE_PIXELS: {e}") from e
    except Image.UnidentifiedImageError:
        # Pillow's message names its in-memory buffer ("<_io.BytesIO object at 0x...>"),
        # which says nothing; the dataset names the file.
        raise DecodeError(
            f"not an image: no format Pillow reads begins with {bytes(head[:12])!r} ({len(head):,} bytes)"
        ) from None
    except Exception as e:
        raise DecodeError(f"unrecognised image header: {e}") from e


def jpeg_end(data: Buffer) -> int:
    """The offset just past the JPEG's end-of-image marker (what follows it, a camera's
    trailer or appended metadata, is not part of the image).

    Walks the marker segments by their lengths (an EXIF thumbnail's own end-of-image
    marker lies inside one) and each scan's entropy-coded data to the marker that ends
    it (0xFF is always stuffed there, so it holds no marker). Stray bytes between
    segments are skipped, as libjpeg does.

    Raises:
        DecodeError: The data ends before the end-of-image marker (a cut-short file), or
            a segment length is corrupt.
    """
    view = memoryview(data).cast("B")
    i, n = 2, len(view)
    scanned = False  # past the first scan: a marker that does not check out is damage, not structure
    while i + 2 <= n:
        if view[i] != 0xFF:  # extraneous bytes before a marker
            m = _SCAN_END.search(view, i)
            if m is None:
                break
            i = m.start()
            continue
        marker = view[i + 1]
        if marker == 0xD9:
            return i + 2
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0x00, 0x01) or 0xD0 <= marker <= 0xD8:  # markers without a length
            i += 2
            continue
        length = (view[i + 2] << 8) | view[i + 3] if i + 4 <= n else 0
        end = i + 2 + length
        # A real segment is followed by a marker (or, after a scan header, by entropy-coded
        # data). In the scans, a byte flipped to 0xFF makes a bogus marker whose "length"
        # rarely checks out: skip it the way libjpeg resynchronises, and let the decoder
        # report the damage, instead of jumping over the real end.
        if not scanned:  # the headers: trusted as they are (stray bytes after one are skipped above)
            if i + 4 > n or end > n:
                break
            if length < 2:
                raise DecodeError(f"corrupt JPEG: segment 0xFF{marker:02X} at byte {i} has length {length}")
        elif not (length >= 2 and end <= n and (marker == 0xDA or end == n or view[end] == 0xFF)):
            m = _SCAN_END.search(view, i + 2)
            if m is None:
                break
            i = m.start()
            continue
        if marker == 0xDA:  # start of scan: its entropy-coded data runs to the next marker
            scanned = True
            m = _SCAN_END.search(view, end)
            if m is None:
                break
            i = m.start()
            continue
        i = end
    # ``i`` is the last segment read (a scan's start, say), not where the bytes stop: the file
    # ends at byte n.
    raise DecodeError(
        f"truncated JPEG: no end-of-image marker ({n:,} bytes; the file ends inside the segment at byte {min(i, n):,})"
    )


def check_jpeg_complete(data: Buffer) -> None:
    """Raises DecodeError when the JPEG was cut short before its end-of-image marker
    (decoders would fill the missing rows with grey); bytes after the marker are fine."""
    jpeg_end(data)
