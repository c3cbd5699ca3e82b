"""The report's PNG encoder: lossless against Pillow's decoder, and input checks."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from xconf.report.png import encode_rgb


def test_round_trips_through_pillow_bit_for_bit() -> None:
    rng = np.random.default_rng(0)
    rgba = rng.integers(0, 256, size=(37, 53, 4), dtype=np.uint8)
    rgba[10:20] = 255  # flat rows, as in a figure
    decoded = Image.open(io.BytesIO(encode_rgb(rgba[:, :, :3])))
    assert decoded.mode == "RGB" and decoded.size == (53, 37)
    assert np.array_equal(np.asarray(decoded), rgba[:, :, :3])


def test_rejects_other_shapes_and_dtypes() -> None:
    with pytest.raises(ValueError):
        encode_rgb(np.zeros((4, 4, 4), dtype=np.uint8))
    with pytest.raises(ValueError):
        encode_rgb(np.zeros((4, 4, 3), dtype=np.float32))
