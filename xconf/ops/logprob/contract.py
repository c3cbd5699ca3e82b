"""Typed, immutable contract of vocab-parallel selected-token logprob.

Reduction semantics (normative):

* Padded vocabulary columns (``real_vocab_size <= column < padded_vocab_size``) are
  masked to ``-inf`` before any partial is formed.
* The padded vocabulary is cut into ``num_vocab_tiles`` equal, contiguous tiles. Each
  tile yields an fp32 partial ``(m_t, s_t) = (max_j z_j, sum_j exp(z_j - m_t))``; a tile
  whose columns are all ``-inf`` yields the identity partial ``(-inf, 0)``.
* Partials travel by ``all_gather`` (the collective moves bytes, it never adds), and
  every rank merges all tiles in global tile order over the same shape:
  ``M = max_t m_t``, ``LSE = M + log(sum_t s_t * exp(m_t - M))``.
* The selected logit is copied from the rank that owns the target column (never summed)
  and ``logprob = z_target - LSE``; inactive rows yield ``0.0``.
* Context parallelism is never a merge axis: CP ranks score disjoint tokens.

``DeterminismScope``: ``fixed_topology`` promises identical bits for repeated runs on
the same TP layout; ``cross_tp_bitwise`` additionally promises identical bits across TP
degrees and shard bounds, which needs a tile structure that does not depend on the TP
partitioning (every tile reduced as the same contiguous shape on any rank).
"""

from __future__ import annotations

import bisect
import hashlib
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from xconf.canonical import canonical_digest
from xconf.operators.capability import (
    DETERMINISM_SCOPES,
    LOGITS_DTYPES,
    MASK_MODES,
    ROLES,
    DeterminismScope,
    LogitsDtype,
    MaskMode,
    Role,
)
from xconf.ops.logprob.errors import LogprobContractError

TORCH_DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in LOGITS_DTYPES}


def dtype_name(dtype: torch.dtype) -> str:
    """The contract's name of a torch dtype (``torch.bfloat16`` -> ``"bfloat16"``)."""
    return str(dtype).removeprefix("torch.")


def check_choice(value: object, allowed: tuple[str, ...], what: str, path: str) -> None:
    if value not in allowed:
        raise LogprobContractError(
            "logprob.contract.invalid_value",
            f"{what} must be one of {list(allowed)}, got {value!r}",
            path,
        )


def _positive_int(value: object, what: str, path: str, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise LogprobContractError(
            "logprob.contract.invalid_value", f"{what} must be an int >= {minimum}", path
        )
    return value


def even_shard_bounds(padded_vocab_size: int, tp_world_size: int) -> tuple[tuple[int, int], ...]:
    """Contiguous near-even bounds; the first ``padded % world`` shards get one more column."""
    base, extra = divmod(padded_vocab_size, tp_world_size)
    bounds: list[tuple[int, int]] = []
    lo = 0
    for rank in range(tp_world_size):
        hi = lo + base + (1 if rank < extra else 0)
        bounds.append((lo, hi))
        lo = hi
    return tuple(bounds)


@dataclass(frozen=True)
class ShardingSpec:
    """Per-rank contiguous vocab shard bounds over the padded vocab, with TP/CP rank."""

    real_vocab_size: int
    padded_vocab_size: int
    shard_bounds: tuple[tuple[int, int], ...]
    tp_rank: int = 0
    cp_rank: int = 0
    cp_world_size: int = 1

    def __post_init__(self) -> None:
        path = "sharding"
        _positive_int(self.real_vocab_size, "real_vocab_size", path)
        _positive_int(self.padded_vocab_size, "padded_vocab_size", path)
        if self.padded_vocab_size < self.real_vocab_size:
            raise LogprobContractError(
                "logprob.contract.padded_smaller_than_real",
                f"padded vocab {self.padded_vocab_size} < real vocab {self.real_vocab_size}",
                path,
            )
        bounds = tuple((int(lo), int(hi)) for lo, hi in self.shard_bounds)
        object.__setattr__(self, "shard_bounds", bounds)
        if not bounds:
            raise LogprobContractError("logprob.contract.no_shards", "no shard bounds", path)
        expected_lo = 0
        for rank, (lo, hi) in enumerate(bounds):
            if lo != expected_lo or hi <= lo:
                raise LogprobContractError(
                    "logprob.contract.shard_bounds",
                    f"shard {rank} bounds ({lo}, {hi}) are not contiguous, non-empty and "
                    f"starting at {expected_lo}",
                    f"{path}.shard_bounds[{rank}]",
                )
            expected_lo = hi
        if expected_lo != self.padded_vocab_size:
            raise LogprobContractError(
                "logprob.contract.shard_bounds",
                f"shard bounds end at {expected_lo}, padded vocab is {self.padded_vocab_size}",
                f"{path}.shard_bounds",
            )
        _positive_int(self.cp_world_size, "cp_world_size", path)
        for name, rank, world in (
            ("tp_rank", self.tp_rank, self.tp_world_size),
            ("cp_rank", self.cp_rank, self.cp_world_size),
        ):
            if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world:
                raise LogprobContractError(
                    "logprob.contract.rank_out_of_range",
                    f"{name}={rank!r} is outside a world of {world}",
                    f"{path}.{name}",
                )

    @classmethod
    def even(
        cls,
        real_vocab_size: int,
        padded_vocab_size: int,
        tp_world_size: int = 1,
        tp_rank: int = 0,
        *,
        cp_rank: int = 0,
        cp_world_size: int = 1,
    ) -> ShardingSpec:
        _positive_int(tp_world_size, "tp_world_size", "sharding")
        return cls(
            real_vocab_size,
            padded_vocab_size,
            even_shard_bounds(padded_vocab_size, tp_world_size),
            tp_rank,
            cp_rank,
            cp_world_size,
        )

    @property
    def tp_world_size(self) -> int:
        return len(self.shard_bounds)

    @property
    def local_bounds(self) -> tuple[int, int]:
        return self.shard_bounds[self.tp_rank]

    @property
    def local_vocab_size(self) -> int:
        lo, hi = self.local_bounds
        return hi - lo

    @property
    def has_padding(self) -> bool:
        return self.padded_vocab_size > self.real_vocab_size

    def owner_rank(self, token_id: int) -> int:
        """The TP rank whose shard holds column ``token_id`` of the padded vocab."""
        if not 0 <= token_id < self.padded_vocab_size:
            raise LogprobContractError(
                "logprob.contract.token_out_of_range",
                f"token id {token_id} is outside the padded vocab [0, {self.padded_vocab_size})",
                "sharding",
            )
        starts = [lo for lo, _ in self.shard_bounds]
        return bisect.bisect_right(starts, token_id) - 1

    def with_rank(self, tp_rank: int, cp_rank: int | None = None) -> ShardingSpec:
        return ShardingSpec(
            self.real_vocab_size,
            self.padded_vocab_size,
            self.shard_bounds,
            tp_rank,
            self.cp_rank if cp_rank is None else cp_rank,
            self.cp_world_size,
        )

    def to_dict(self, *, include_ranks: bool = True) -> dict[str, Any]:
        record: dict[str, Any] = {
            "real_vocab_size": self.real_vocab_size,
            "padded_vocab_size": self.padded_vocab_size,
            "shard_bounds": [list(b) for b in self.shard_bounds],
            "tp_world_size": self.tp_world_size,
            "cp_world_size": self.cp_world_size,
        }
        if include_ranks:
            record["tp_rank"] = self.tp_rank
            record["cp_rank"] = self.cp_rank
        return record


@dataclass(frozen=True)
class MaskSpec:
    """Which rows are scored: an explicit active mask, or ``target == ignore_index``.

    ``ignore_index`` mode cannot express an inactive row whose target is a real token;
    contracts that need that must use ``explicit_active_mask``.
    """

    mode: MaskMode = "explicit_active_mask"
    ignore_index: int | None = None

    def __post_init__(self) -> None:
        check_choice(self.mode, MASK_MODES, "mask mode", "mask.mode")
        if self.mode == "ignore_index" and not isinstance(self.ignore_index, int):
            raise LogprobContractError(
                "logprob.contract.ignore_index_missing",
                "ignore_index mode needs an integer ignore_index",
                "mask.ignore_index",
            )
        if self.mode == "explicit_active_mask" and self.ignore_index is not None:
            raise LogprobContractError(
                "logprob.contract.ignore_index_unused",
                "explicit_active_mask mode takes no ignore_index",
                "mask.ignore_index",
            )

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "ignore_index": self.ignore_index}


@dataclass(frozen=True)
class ReductionSpec:
    """fp32 ``(max, sumexp)`` partials merged in fixed global tile order via all_gather."""

    accumulation_dtype: Literal["float32"] = "float32"
    partials: Literal["max_sumexp"] = "max_sumexp"
    merge_order: Literal["fixed_global_tile"] = "fixed_global_tile"
    transport: Literal["all_gather"] = "all_gather"
    merge_axes: tuple[str, ...] = ("tp",)
    determinism_scope: DeterminismScope = "cross_tp_bitwise"

    def __post_init__(self) -> None:
        path = "reduction"
        check_choice(self.accumulation_dtype, ("float32",), "accumulation_dtype", path)
        check_choice(self.partials, ("max_sumexp",), "partials", path)
        check_choice(self.merge_order, ("fixed_global_tile",), "merge_order", path)
        check_choice(self.transport, ("all_gather",), "transport", path)
        check_choice(self.determinism_scope, DETERMINISM_SCOPES, "determinism_scope", path)
        axes = tuple(self.merge_axes)
        object.__setattr__(self, "merge_axes", axes)
        if "cp" in axes:
            raise LogprobContractError(
                "logprob.contract.cp_merge_axis",
                "context parallelism is never a merge axis: CP ranks score disjoint tokens",
                f"{path}.merge_axes",
            )
        if axes != ("tp",):
            raise LogprobContractError(
                "logprob.contract.invalid_value", "merge_axes must be ('tp',)", path
            )

    def to_dict(self) -> dict[str, Any]:
        return {
            "accumulation_dtype": self.accumulation_dtype,
            "partials": self.partials,
            "merge_order": self.merge_order,
            "transport": self.transport,
            "merge_axes": list(self.merge_axes),
            "determinism_scope": self.determinism_scope,
        }


@dataclass(frozen=True)
class OutputSpec:
    """fp32 selected logprob and fp32 vocab LSE, both replicated across the TP group."""

    logprob_dtype: Literal["float32"] = "float32"
    lse_dtype: Literal["float32"] = "float32"
    replication: Literal["tp_group"] = "tp_group"

    def __post_init__(self) -> None:
        check_choice(self.logprob_dtype, ("float32",), "logprob_dtype", "output")
        check_choice(self.lse_dtype, ("float32",), "lse_dtype", "output")
        check_choice(self.replication, ("tp_group",), "replication", "output")

    def to_dict(self) -> dict[str, Any]:
        return {
            "logprob_dtype": self.logprob_dtype,
            "lse_dtype": self.lse_dtype,
            "replication": self.replication,
        }


def normalize_logprob_backend_id(backend_id: object) -> str:
    """Strip and lower-case a backend id; empty or non-string ids are errors."""
    if not isinstance(backend_id, str) or not backend_id.strip():
        raise LogprobContractError(
            "logprob.contract.invalid_backend_id",
            f"backend id must be a non-empty string, got {backend_id!r}",
            "backend_id",
        )
    return backend_id.strip().lower()


@dataclass(frozen=True)
class LogprobContract:
    """Everything a backend must honour for one selected-logprob call site."""

    sharding: ShardingSpec
    logits_dtype: LogitsDtype = "float32"
    role: Role = "training"
    mask: MaskSpec = field(default_factory=MaskSpec)
    reduction: ReductionSpec = field(default_factory=ReductionSpec)
    output: OutputSpec = field(default_factory=OutputSpec)
    requested_backend: str = "auto"

    def __post_init__(self) -> None:
        check_choice(self.logits_dtype, LOGITS_DTYPES, "logits_dtype", "logits_dtype")
        check_choice(self.role, ROLES, "role", "role")
        backend = normalize_logprob_backend_id(self.requested_backend)
        object.__setattr__(self, "requested_backend", backend)

    def to_dict(self, *, include_ranks: bool = True) -> dict[str, Any]:
        return {
            "sharding": self.sharding.to_dict(include_ranks=include_ranks),
            "logits_dtype": self.logits_dtype,
            "role": self.role,
            "mask": self.mask.to_dict(),
            "reduction": self.reduction.to_dict(),
            "output": self.output.to_dict(),
            "requested_backend": self.requested_backend,
        }

    def cross_rank_fingerprint(self) -> str:
        """SHA-256 of the contract without any rank: equal on every rank of one group."""
        return canonical_digest(self.to_dict(include_ranks=False))


def summarize_active_mask(active_mask: torch.Tensor) -> dict[str, Any]:
    """Provenance of a mask: its length, active count and SHA-256 of its bytes."""
    flat = active_mask.detach().reshape(-1).to(device="cpu", dtype=torch.uint8).contiguous()
    return {
        "length": int(flat.numel()),
        "active_count": int(flat.sum().item()),
        "sha256": hashlib.sha256(flat.numpy().tobytes()).hexdigest(),
    }
