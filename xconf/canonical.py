"""The one canonical JSON form and its SHA-256: what every id, key and fingerprint hashes.

Canonical: keys sorted, no whitespace (``","`` and ``":"``), ASCII only. Torch-free and
dependency-free, so planning, launchers, adapters and the report all share it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any


def canonical_json(
    document: Any, *, allow_nan: bool = True, default: Callable[[Any], Any] | None = None
) -> str:
    """``document`` in canonical form; ``allow_nan=False`` refuses NaN and infinities
    (``ValueError``), ``default`` converts what JSON cannot hold (as in ``json.dumps``)."""
    return json.dumps(
        document,
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=True,
        allow_nan=allow_nan,
        default=default,
    )


def canonical_digest(
    document: Any, *, allow_nan: bool = True, default: Callable[[Any], Any] | None = None
) -> str:
    """Hex SHA-256 of :func:`canonical_json`."""
    text = canonical_json(document, allow_nan=allow_nan, default=default)
    return hashlib.sha256(text.encode()).hexdigest()
