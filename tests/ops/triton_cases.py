"""The Triton kernels' correctness cases (not collected by the main suite: they need Triton).

Run in a process of their own, where Triton is importable: on CPU under Triton's
interpreter (``tests/ops/test_triton_interpreter.py`` starts that process for
``make test``), or on a GPU by ``scripts/device-check`` with ``XCONF_TEST_DEVICE=cuda``.
"""

from __future__ import annotations

import os

import pytest
import torch

from tests.bitwise import bits
from xconf.ops.logprob.contract import LogprobContract, ShardingSpec
from xconf.ops.logprob.simulate import simulated_forward
from xconf.ops.logprob.triton_kernels import kernel
from xconf.ops.logprob.vocab_parallel import vocab_parallel_selected_logprob

DEVICE = os.environ.get("XCONF_TEST_DEVICE", "cpu")
NEG_INF, NAN = float("-inf"), float("nan")
# fp32 logprob threshold; bf16 logits are read exactly, so it holds for them too.
THRESHOLD = 1e-5


def _inputs(
    rows: int, real: int, padded: int, dtype: torch.dtype, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    scale = torch.logspace(-2, 1.5, rows)[:, None]
    logits = torch.randn(rows, padded, generator=gen) * scale
    logits[:, real:] = 7.0  # padding holds junk that must never count
    target = torch.randint(0, real, (rows,), generator=gen)
    active = torch.rand(rows, generator=gen) > 0.2
    return logits.to(dtype).to(DEVICE), target.to(DEVICE), active.to(DEVICE)


def _reference(logits: torch.Tensor, target: torch.Tensor, real: int) -> torch.Tensor:
    lse = torch.logsumexp(logits[:, :real].double(), -1)
    return logits.double().gather(1, target[:, None]).squeeze(1) - lse


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("width", [1, 17, 32, 39])
def test_partials_match_float64(dtype: torch.dtype, width: int) -> None:
    x, _, _ = _inputs(9, width, width, dtype, seed=width)
    m, s = kernel().row_partials(x)
    xd = x.double()
    ref_m = xd.amax(-1)
    ref_s = torch.exp(xd - ref_m[:, None]).sum(-1)
    assert torch.equal(m.double(), ref_m)
    assert ((s.double() - ref_s) / ref_s).abs().max() <= 1e-6


def test_special_rows_and_merge() -> None:
    x = torch.tensor([[NEG_INF] * 4, [0.0, NEG_INF, NEG_INF, NEG_INF], [1.0, NAN, 0.0, 0.0]])
    m, s = kernel().row_partials(x.to(DEVICE))
    assert m[0] == NEG_INF and s[0] == 0.0 and m[1] == 0.0 and s[1] == 1.0
    assert torch.isnan(s[2])
    lse = kernel().merge_lse(m.view(1, 3)[:, :2], s.view(1, 3)[:, :2])
    assert lse.item() == 0.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_operator_matches_float64_and_bits_hold_across_tp(dtype: torch.dtype) -> None:
    """TP 1, 2, 4, 8 (simulated shards), tiles of 32 and of 39 columns: identical bits."""
    for real, padded, tiles in ((250, 256, 8), (310, 312, 8)):
        logits, target, active = _inputs(12, real, padded, dtype)
        runs = [
            simulated_forward(
                logits, target, active, real_vocab_size=real, world=w, impl="triton",
                num_vocab_tiles=tiles,
            )
            for w in (1, 2, 4, 8)
        ]  # fmt: skip
        for lp, lse in runs[1:]:
            assert torch.equal(bits(lp), bits(runs[0][0]))
            assert torch.equal(bits(lse), bits(runs[0][1]))
        ref = _reference(logits, target, real)
        assert (runs[0][0].double() - torch.where(active, ref, 0.0)).abs().max() <= THRESHOLD


def test_real_operator_equals_simulation_batch_invariance_and_gradients() -> None:
    real, padded = 250, 256
    logits, target, active = _inputs(10, real, padded, torch.float32)
    contract = LogprobContract(ShardingSpec.even(real, padded))
    x = logits.clone().requires_grad_()
    lp, lse = vocab_parallel_selected_logprob(
        x, target, active, contract=contract, num_vocab_tiles=8, impl="triton"
    )
    sim_lp, sim_lse = simulated_forward(
        logits, target, active, real_vocab_size=real, world=1, impl="triton", num_vocab_tiles=8
    )
    assert torch.equal(bits(lp.detach()), bits(sim_lp))
    assert torch.equal(bits(lse.detach()), bits(sim_lse))
    alone, _ = vocab_parallel_selected_logprob(
        logits[3:4], target[3:4], active[3:4], contract=contract, num_vocab_tiles=8, impl="triton"
    )
    assert torch.equal(bits(alone), bits(lp.detach()[3:4]))
    # The same logits from a base 4 bytes off 16-byte alignment: the same code, same bits.
    storage = torch.empty(logits.numel() + 1, dtype=logits.dtype, device=logits.device)
    shifted = storage[1:].view_as(logits)
    shifted.copy_(logits)
    moved, _ = vocab_parallel_selected_logprob(
        shifted, target, active, contract=contract, num_vocab_tiles=8, impl="triton"
    )
    assert torch.equal(bits(moved), bits(lp.detach()))
    lp.sum().backward()
    y = logits[:, :real].double().requires_grad_()
    ref = y.gather(1, target[:, None]).squeeze(1) - torch.logsumexp(y, -1)
    torch.where(active, ref, 0.0).sum().backward()
    assert x.grad is not None and y.grad is not None
    assert (x.grad[:, :real].double() - y.grad).abs().max() <= THRESHOLD
    assert torch.all(x.grad[:, real:] == 0)
