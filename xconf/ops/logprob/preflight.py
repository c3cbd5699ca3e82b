"""Cross-rank agreement check, run on every call with TP > 1 whatever ``validate`` says.

Ranks that disagree on the contract, the backend, the tile count, the determinism scope,
the row count or the scored tokens would enter the data collective with different
payload shapes or semantics, which hangs or corrupts a TP group. So before it, every
rank contributes a fixed-size int64 digest to an ``all_gather`` (a fixed shape cannot
mismatch) and every rank compares all digests: all of them fail together, loudly.
A rank whose local checks failed takes part too, so its peers never wait for it.

The digest gather is started asynchronously (:func:`start`): the operator computes its
rank-local tile partials while the small collective is in flight, and finishes the
agreement (:meth:`PendingAgreement.finish`) before it enters the data collective, so the
check's latency hides behind local work and is never skipped.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from xconf.errors import XconfError
from xconf.ops.logprob.errors import LogprobPreflightError

# Compared in this order, so the most specific reason is the one reported (the contract
# fingerprint covers the determinism scope too).
FIELDS = (
    "magic",
    "determinism_mode",
    "contract_fingerprint",
    "backend_id",
    "num_vocab_tiles",
    "impl",
    "rows",
    "target_ids",
    "active_mask",
    "local_error",
)
_MAGIC = 0x78636F6E66  # "xconf"


def text_digest(text: str) -> int:
    """A signed 64-bit digest of a string (0 is reserved for "no error")."""
    value = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little", signed=True)
    return value or 1


def tensor_digest(values: torch.Tensor) -> int:
    """An order-sensitive int64 digest of an integer or bool vector (wraps on overflow)."""
    flat = values.detach().reshape(-1).to(device="cpu", dtype=torch.int64)
    weights = torch.arange(1, 2 * flat.numel() + 1, 2, dtype=torch.int64)
    mixed = flat * 0x9E3779B1 + weights * 0x85EBCA77
    return int((mixed * weights).sum().item())


def build_digest(
    *,
    fingerprint: str,
    backend_id: str,
    num_vocab_tiles: int,
    determinism_scope: str,
    impl: str,
    target_ids: torch.Tensor | None,
    active_mask: torch.Tensor | None,
    rows: int,
    local_error: XconfError | None,
) -> torch.Tensor:
    values = [
        _MAGIC,
        text_digest(determinism_scope),
        text_digest(fingerprint),
        text_digest(backend_id),
        int(num_vocab_tiles),
        text_digest(impl),
        int(rows),
        0 if target_ids is None else tensor_digest(target_ids),
        0 if active_mask is None else tensor_digest(active_mask),
        0 if local_error is None else text_digest(local_error.code),
    ]
    return torch.tensor(values, dtype=torch.int64)


@dataclass
class PendingAgreement:
    """A started digest gather; :meth:`finish` must run before any data collective."""

    digest: torch.Tensor
    gathered: list[torch.Tensor]
    work: Any
    rank: int
    finished: bool = False

    def finish(self, local_error: XconfError | None) -> None:
        """Wait for every rank's digest and raise on all ranks if any field differs (a
        rank's own local error first). A second call does nothing."""
        if self.finished:
            return
        self.finished = True
        self.work.wait()
        _compare(self.digest, self.gathered, self.rank, local_error)


def start(digest: torch.Tensor, group: Any, world_size: int, rank: int) -> PendingAgreement:
    """Start gathering every rank's digest (a fixed-shape ``all_gather``) without waiting."""
    gathered = [torch.empty_like(digest) for _ in range(world_size)]
    work = dist.all_gather(gathered, digest, group=group, async_op=True)
    return PendingAgreement(digest, gathered, work, rank)


def _compare(
    digest: torch.Tensor, gathered: list[torch.Tensor], rank: int, local_error: XconfError | None
) -> None:
    if local_error is not None:
        raise local_error
    failed = [r for r, d in enumerate(gathered) if int(d[-1]) != 0]
    if failed:
        raise LogprobPreflightError(
            "logprob.preflight.peer_failed",
            f"rank(s) {failed} failed local validation before the collective",
            "tp_group",
        )
    mine = digest.tolist()
    for field_index, name in enumerate(FIELDS):
        values = [int(d[field_index]) for d in gathered]
        if any(v != mine[field_index] for v in values):
            others = [r for r, v in enumerate(values) if v != mine[field_index]]
            raise LogprobPreflightError(
                f"logprob.preflight.{name}_mismatch",
                f"TP rank {rank} disagrees with rank(s) {others} on {name} "
                f"(values by rank: {values}); refusing to enter the collective",
                "tp_group",
            )
