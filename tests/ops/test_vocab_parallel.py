"""Single-process checks of the operator: accuracy, batch invariance, gradients, errors."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from _logprob_workers import NUM_TILES, inputs

from tests.bitwise import bits
from xconf.ops.logprob.contract import (
    LogprobContract,
    MaskSpec,
    ReductionSpec,
    ShardingSpec,
)
from xconf.ops.logprob.errors import LogprobValidationError
from xconf.ops.logprob.vocab_parallel import (
    default_num_vocab_tiles,
    vocab_parallel_selected_logprob,
)

FP32_THRESHOLD = 1e-5


def _contract(
    real: int = 250, padded: int = 256, dtype: str = "float32", **kw: Any
) -> LogprobContract:
    return LogprobContract(ShardingSpec.even(real, padded), logits_dtype=dtype, **kw)  # type: ignore[arg-type]


def _score(
    logits: torch.Tensor, target: torch.Tensor, active: torch.Tensor | None, **kw: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    dtype = str(logits.dtype).removeprefix("torch.")
    real = kw.pop("real", 250)
    padded = kw.pop("padded", 256)
    contract = kw.pop("contract", None) or _contract(real, padded, dtype)
    kw.setdefault("num_vocab_tiles", NUM_TILES)
    return vocab_parallel_selected_logprob(logits, target, active, contract=contract, **kw)


def _reference(
    logits: torch.Tensor, target: torch.Tensor, active: torch.Tensor, real: int
) -> tuple[torch.Tensor, torch.Tensor]:
    z = logits[:, :real].double()
    lse = torch.logsumexp(z, -1)
    picked = z.gather(1, target.clamp(0, real - 1)[:, None]).squeeze(1) - lse
    return torch.where(active, picked, 0.0), lse


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_accuracy_against_float64(dtype: torch.dtype) -> None:
    logits, target, active, _ = inputs(250, 256, dtype)
    logprob, lse = _score(logits, target, active)
    ref_lp, ref_lse = _reference(logits, target, active, 250)
    assert logprob.dtype == lse.dtype == torch.float32
    assert (logprob.double() - ref_lp).abs().max() <= FP32_THRESHOLD
    assert (lse[active].double() - ref_lse[active]).abs().max() <= FP32_THRESHOLD
    assert torch.all(logprob[~active] == 0.0)


def test_batch_invariance_and_repeatability() -> None:
    logits, target, active, _ = inputs(250, 256, torch.float32)
    full, full_lse = _score(logits, target, active)
    again, _ = _score(logits, target, active)
    assert torch.equal(bits(full), bits(again))
    for i in range(logits.shape[0]):
        alone, alone_lse = _score(logits[i : i + 1], target[i : i + 1], active[i : i + 1])
        assert torch.equal(bits(alone), bits(full[i : i + 1])), i
        assert torch.equal(bits(alone_lse), bits(full_lse[i : i + 1])), i
    order = torch.randperm(logits.shape[0], generator=torch.Generator().manual_seed(1))
    big = torch.cat([logits[order]] * 40)  # 520 rows: several fixed row blocks
    shuffled, _ = _score(big, torch.cat([target[order]] * 40), torch.cat([active[order]] * 40))
    assert torch.equal(bits(shuffled[: len(order)]), bits(full[order]))
    assert torch.equal(bits(shuffled[-len(order) :]), bits(full[order]))


@pytest.mark.parametrize("scope", ["cross_tp_bitwise", "fixed_topology"])
def test_gradients_match_autograd_on_plain_reference(scope: str) -> None:
    logits, target, active, weights = inputs(250, 256, torch.float32)
    contract = _contract(reduction=ReductionSpec(determinism_scope=scope))  # type: ignore[arg-type]
    x = logits.clone().requires_grad_()
    lp, lse = _score(x, target, active, contract=contract)
    ((lp * weights[0]).sum() + (torch.where(active, lse, 0) * weights[1]).sum()).backward()
    y = logits[:, :250].double().requires_grad_()
    ref_lp, ref_lse = _reference(y, target, active, 250)
    ((ref_lp * weights[0]).sum() + (torch.where(active, ref_lse, 0) * weights[1]).sum()).backward()
    assert x.grad is not None and y.grad is not None
    assert (x.grad[:, :250].double() - y.grad).abs().max() <= 1e-6
    assert torch.all(x.grad[:, 250:] == 0) and torch.all(x.grad[~active] == 0)


def test_ignore_index_mode_and_zero_rows() -> None:
    logits, target, _, _ = inputs(256, 256, torch.float32)
    target[4], target[7] = -100, 3
    contract = _contract(256, 256, mask=MaskSpec("ignore_index", -100))
    lp, _ = _score(logits, target, None, contract=contract)
    assert lp[4] == 0.0 and torch.all(lp[torch.arange(len(lp)) != 4] < 0)
    with pytest.raises(LogprobValidationError) as err:
        inactive = torch.ones_like(target, dtype=torch.bool)
        inactive[5] = False  # inactive but holding a real token: not expressible
        _score(logits, target, inactive, contract=contract)
    assert err.value.code == "logprob.call.mask_inexpressible"
    empty, empty_lse = _score(logits[:0], target[:0], None, real=256)
    assert empty.shape == empty_lse.shape == (0,)


def test_default_tiles_depend_on_padded_vocab_only() -> None:
    assert default_num_vocab_tiles(151936) == 64  # 2374 columns, aligned for TP 1/2/4/8
    assert default_num_vocab_tiles(256) == 8
    assert 151936 // default_num_vocab_tiles(151936) <= 4096


def _error(**kw: Any) -> str:
    logits, target, active, _ = inputs(250, 256, torch.float32)
    args: dict[str, Any] = {"logits": logits, "target": target, "active": active, **kw}
    with pytest.raises(LogprobValidationError) as err:
        _score(args.pop("logits"), args.pop("target"), args.pop("active"), **args)
    return err.value.code


def test_validation_errors_have_codes() -> None:
    logits, target, active, _ = inputs(250, 256, torch.float32)
    assert _error(logits=logits[:, :200]) == "logprob.call.shard_size"
    assert _error(active=active[:5]) == "logprob.call.mask_length"
    assert _error(active=active.int()) == "logprob.call.mask_length"
    assert _error(logits=logits.bfloat16(), contract=_contract()) == "logprob.call.dtype_mismatch"
    assert _error(target=target.float()) == "logprob.call.target_dtype"
    assert _error(num_vocab_tiles=3) == "logprob.call.tiles_not_dividing"
    assert _error(impl="cuda") == "logprob.call.invalid_impl"
    assert _error(impl="triton") == "logprob.call.triton_unavailable"  # not in this venv
    bad = target.clone()
    bad[0] = 252
    assert _error(target=bad) == "logprob.call.target_in_padding"
    bad[0] = 400
    assert _error(target=bad) == "logprob.call.target_out_of_range"
    dead = logits.clone()
    dead[1, :250] = float("-inf")
    assert _error(logits=dead) == "logprob.call.row_all_neg_inf"
    # Tiles of 64 columns cannot align with an uneven shard bound at 96.
    uneven = LogprobContract(ShardingSpec(250, 256, ((0, 96), (96, 256))))
    assert (
        _error(logits=logits[:, :96], contract=uneven, num_vocab_tiles=4)
        == "logprob.call.tiles_not_aligned"
    )


def test_validate_false_skips_data_checks_only() -> None:
    logits, target, active, _ = inputs(250, 256, torch.float32)
    bad = target.clone()
    bad[0] = 252
    lp, _ = _score(logits, bad, active, validate=False)
    assert torch.isfinite(lp[1:]).all()
    with pytest.raises(LogprobValidationError):
        _score(logits[:, :200], target, active, validate=False)


def test_cuda_is_declared_for_the_triton_kernels_only() -> None:
    """Declared because tests/ops/test_triton_interpreter.py checks the Triton kernels."""
    from xconf.operators.catalog import SELECTED_LOGPROB, SemanticOperatorCatalog
    from xconf.ops.logprob.impls import resolve_impl

    catalog = SemanticOperatorCatalog.from_entry_points()
    descriptor = catalog.get(SELECTED_LOGPROB, "xconf.vocab_parallel_logp")
    assert descriptor is not None and descriptor.capability("cuda") is not None
    with pytest.raises(LogprobValidationError) as err:  # no Triton in this environment
        resolve_impl("auto", "cuda")
    assert err.value.code == "logprob.call.triton_unavailable"


@pytest.mark.parametrize("impl", ["native", "compiled"])
def test_batch_invariance_across_row_counts_and_offsets(impl: str) -> None:
    # Wide-range logits and row counts around every SIMD width: a row's bits must not
    # depend on how many rows share its call or where it sits among them.
    gen = torch.Generator().manual_seed(3)
    rows = 150
    logits = torch.randn(rows, 256, generator=gen) * torch.logspace(-2, 2, rows)[:, None]
    target = torch.randint(0, 250, (rows,), generator=gen)
    active = torch.ones(rows, dtype=torch.bool)
    x = logits.clone().requires_grad_()
    full, full_lse = _score(x, target, active, impl=impl)
    full.sum().backward()
    assert x.grad is not None
    for start, size in ((0, 1), (3, 15), (7, 16), (20, 17), (40, 63), (50, 64), (60, 65)):
        part = slice(start, start + size)
        y = logits[part].clone().requires_grad_()
        lp, lse = _score(y, target[part], active[part], impl=impl)
        lp.sum().backward()
        assert y.grad is not None
        assert torch.equal(bits(lp), bits(full[part])), (start, size)
        assert torch.equal(bits(lse), bits(full_lse[part])), (start, size)
        assert torch.equal(bits(y.grad), bits(x.grad[part])), (start, size)
