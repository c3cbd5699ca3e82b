"""The typed contract: sharding, mask, reduction, output specs and the fingerprint."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from xconf.errors import OperatorResolutionError, XconfError
from xconf.operators.capability import BackendCapability
from xconf.ops.logprob.contract import (
    LogprobContract,
    MaskSpec,
    OutputSpec,
    ReductionSpec,
    ShardingSpec,
    even_shard_bounds,
    summarize_active_mask,
)
from xconf.ops.logprob.errors import LogprobContractError


def test_even_bounds_cover_padded_vocab_and_pin_last_bound() -> None:
    assert even_shard_bounds(10, 3) == ((0, 4), (4, 7), (7, 10))
    bounds = even_shard_bounds(151936, 4)
    assert bounds[-1][1] == 151936 and len(bounds) == 4


def test_sharding_owner_rank_and_local_bounds() -> None:
    spec = ShardingSpec(250, 256, ((0, 96), (96, 256)), tp_rank=1)
    assert spec.tp_world_size == 2
    assert spec.local_bounds == (96, 256) and spec.local_vocab_size == 160
    assert [spec.owner_rank(t) for t in (0, 95, 96, 255)] == [0, 0, 1, 1]
    assert spec.has_padding
    with pytest.raises(LogprobContractError) as err:
        spec.owner_rank(256)
    assert err.value.code == "logprob.contract.token_out_of_range"


@pytest.mark.parametrize(
    ("kwargs", "code"),
    [
        ({"shard_bounds": ((0, 100), (101, 256))}, "logprob.contract.shard_bounds"),
        ({"shard_bounds": ((0, 128),)}, "logprob.contract.shard_bounds"),
        ({"shard_bounds": ((0, 0), (0, 256))}, "logprob.contract.shard_bounds"),
        ({"shard_bounds": ()}, "logprob.contract.no_shards"),
        ({"real_vocab_size": 300}, "logprob.contract.padded_smaller_than_real"),
        ({"tp_rank": 2}, "logprob.contract.rank_out_of_range"),
        ({"cp_rank": 1}, "logprob.contract.rank_out_of_range"),
    ],
)
def test_sharding_rejects_malformed_specs(kwargs: dict[str, object], code: str) -> None:
    base: dict[str, object] = {
        "real_vocab_size": 250,
        "padded_vocab_size": 256,
        "shard_bounds": ((0, 128), (128, 256)),
    }
    with pytest.raises(LogprobContractError) as err:
        ShardingSpec(**{**base, **kwargs})  # type: ignore[arg-type]
    assert err.value.code == code
    assert isinstance(err.value, XconfError) and err.value.path


def test_specs_are_frozen() -> None:
    spec = ShardingSpec.even(256, 256, 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.tp_rank = 1  # type: ignore[misc]


def test_mask_spec_modes() -> None:
    assert MaskSpec().mode == "explicit_active_mask"
    assert MaskSpec("ignore_index", -100).ignore_index == -100
    with pytest.raises(LogprobContractError, match="ignore_index"):
        MaskSpec("ignore_index")
    with pytest.raises(LogprobContractError):
        MaskSpec("explicit_active_mask", -100)
    with pytest.raises(LogprobContractError):
        MaskSpec("sometimes")  # type: ignore[arg-type]


def test_reduction_spec_never_merges_over_cp_and_validates_scope() -> None:
    spec = ReductionSpec()
    assert spec.determinism_scope == "cross_tp_bitwise"
    assert (spec.accumulation_dtype, spec.partials, spec.transport) == (
        "float32",
        "max_sumexp",
        "all_gather",
    )
    with pytest.raises(LogprobContractError) as err:
        ReductionSpec(merge_axes=("tp", "cp"))
    assert err.value.code == "logprob.contract.cp_merge_axis"
    with pytest.raises(LogprobContractError):
        ReductionSpec(determinism_scope="deterministic")  # type: ignore[arg-type]
    with pytest.raises(LogprobContractError):
        ReductionSpec(transport="all_reduce")  # type: ignore[arg-type]


def test_output_spec_is_fp32_replicated() -> None:
    assert OutputSpec().to_dict() == {
        "logprob_dtype": "float32",
        "lse_dtype": "float32",
        "replication": "tp_group",
    }
    with pytest.raises(LogprobContractError):
        OutputSpec(logprob_dtype="bfloat16")  # type: ignore[arg-type]


def test_cross_rank_fingerprint_is_rank_independent() -> None:
    contracts = [
        LogprobContract(ShardingSpec.even(250, 256, 4, rank, cp_rank=cp, cp_world_size=2))
        for rank in range(4)
        for cp in range(2)
    ]
    assert len({c.cross_rank_fingerprint() for c in contracts}) == 1
    other = LogprobContract(
        ShardingSpec.even(250, 256, 4), reduction=ReductionSpec(determinism_scope="fixed_topology")
    )
    assert other.cross_rank_fingerprint() != contracts[0].cross_rank_fingerprint()
    even = LogprobContract(ShardingSpec.even(250, 256, 4, 3))
    explicit = LogprobContract(ShardingSpec(250, 256, ((0, 64), (64, 128), (128, 192), (192, 256))))
    assert explicit.cross_rank_fingerprint() == even.cross_rank_fingerprint()
    assert even.cross_rank_fingerprint() != contracts[0].cross_rank_fingerprint()  # CP world
    shifted = LogprobContract(ShardingSpec(250, 256, ((0, 32), (32, 128), (128, 192), (192, 256))))
    assert shifted.cross_rank_fingerprint() != even.cross_rank_fingerprint()


def test_contract_normalizes_backend_id_and_checks_fields() -> None:
    contract = LogprobContract(
        ShardingSpec.even(8, 8), requested_backend="  XConf.Vocab_Parallel_Logp "
    )
    assert contract.requested_backend == "xconf.vocab_parallel_logp"
    with pytest.raises(LogprobContractError):
        LogprobContract(ShardingSpec.even(8, 8), requested_backend="  ")
    with pytest.raises(LogprobContractError):
        LogprobContract(ShardingSpec.even(8, 8), logits_dtype="fp8")  # type: ignore[arg-type]


def test_mask_provenance_is_a_summary_with_digest() -> None:
    a = torch.tensor([True, False, True, True])
    b = torch.tensor([True, True, False, True])
    sa, sb = summarize_active_mask(a), summarize_active_mask(b)
    assert sa["active_count"] == sb["active_count"] == 3 and sa["length"] == 4
    assert sa["sha256"] != sb["sha256"] and len(sa["sha256"]) == 64
    assert "mask" not in LogprobContract(ShardingSpec.even(8, 8)).to_dict()["mask"]


def _cap(**overrides: object) -> BackendCapability:
    base: dict[str, object] = {
        "platform": "cpu",
        "tier": "production",
        "roles": {"rollout", "training"},
        "dtypes": {"float32"},
        "mask_modes": {"explicit_active_mask"},
        "determinism_scopes": {"fixed_topology"},
    }
    return BackendCapability(**{**base, **overrides})  # type: ignore[arg-type]


def test_capability_normalizes_and_rejects_non_iterables() -> None:
    cap = _cap(roles=["rollout", "training", "rollout"])
    assert cap.roles == frozenset({"rollout", "training"})
    for field in ("roles", "dtypes"):
        with pytest.raises(OperatorResolutionError) as err:
            _cap(**{field: 3})
        assert err.value.code == "operator.capability.not_iterable"
        with pytest.raises(OperatorResolutionError):
            _cap(**{field: "float32"})
    with pytest.raises(OperatorResolutionError) as bad:
        _cap(dtypes={"float32", "fp8"})
    assert bad.value.code == "operator.capability.invalid_value" and "fp8" in bad.value.message
    with pytest.raises(OperatorResolutionError):
        _cap(tier="deterministic")
    with pytest.raises(OperatorResolutionError):
        _cap(tp_sizes={0})


def test_capability_reasons_name_every_gap() -> None:
    cap = _cap(tp_sizes={1}, supports_padding=False, mask_modes={"ignore_index"})
    contract = LogprobContract(ShardingSpec.even(250, 256, 2), logits_dtype="bfloat16")
    reasons = " | ".join(cap.reasons_against(contract))
    for needle in ("bfloat16", "TP size 2", "padded", "ignore_index cannot express", "cross_tp"):
        assert needle in reasons
