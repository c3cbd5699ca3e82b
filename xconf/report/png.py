"""A lossless PNG encoder for the report's RGB figures, twice as fast as Pillow's here.

Every scanline uses PNG's "Up" filter (the byte difference with the row above, computed
for the whole image in one numpy subtraction) and the result is deflated at zlib level 2.
Pillow's encoder picks a filter per line, which costs more CPU than the deflate for these
mostly flat figures and gives larger files: with 256 case figures per report that was
about half of the figure time.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np

SIGNATURE = b"\x89PNG\r\n\x1a\n"
UP_FILTER = 2
LEVEL = 2


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def encode_rgb(pixels: np.ndarray) -> bytes:
    """PNG bytes of an ``[height, width, 3]`` uint8 array (an RGBA array's first three
    channels may be passed as a view)."""
    if pixels.ndim != 3 or pixels.shape[2] != 3 or pixels.dtype != np.uint8:
        raise ValueError(f"expected [h, w, 3] uint8 pixels, got {pixels.shape} {pixels.dtype}")
    height, width, _ = pixels.shape
    rows = np.ascontiguousarray(pixels).reshape(height, width * 3)
    raw = np.empty((height, width * 3 + 1), dtype=np.uint8)
    raw[:, 0] = UP_FILTER
    raw[0, 1:] = rows[0]  # the row above the first is zeros
    np.subtract(rows[1:], rows[:-1], out=raw[1:, 1:])  # uint8 arithmetic wraps mod 256
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    return (
        SIGNATURE
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", zlib.compress(raw.tobytes(), LEVEL))
        + _chunk(b"IEND", b"")
    )
