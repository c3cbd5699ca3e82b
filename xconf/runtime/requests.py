"""The ``batch.size`` an engine actually ran, read from the sizes of the requests it answered."""

from __future__ import annotations

from collections.abc import Sequence


def batch_size_from_requests(sizes: Sequence[int], requested: int | None) -> int | None:
    """The batch size the answered requests show (None when the engine answered none).

    Chunking N samples by b gives requests of b, the last one possibly shorter; a single
    request of n samples is what every b >= n gives, so it shows ``requested`` when that is
    at least n. Any other pattern shows its largest request, which differs from the request:
    the knob then reads as a fallback, never as applied.
    """
    if not sizes:
        return None
    *full, last = (int(s) for s in sizes)
    if not full:
        return requested if requested is not None and requested >= last else last
    if len(set(full)) != 1 or last > full[0]:
        return max([*full, last])
    return full[0]
