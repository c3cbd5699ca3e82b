"""The forced-decoding logits processor follows vLLM's persistent batch (unit level)."""

from __future__ import annotations

import pytest

from tests.adapters.conftest import needs_vllm

pytestmark = needs_vllm


def _processor():
    from xconf.adapters.vllm.forcing import ForcedTokensLogitsProcessor

    return ForcedTokensLogitsProcessor(None, None, False)  # type: ignore[arg-type]


def _update(proc, removed=(), added=(), moved=(), size=4):
    from vllm.v1.sample.logits_processor import BatchUpdate

    proc.update_state(
        BatchUpdate(batch_size=size, removed=list(removed), added=list(added), moved=list(moved))
    )


def _params(forced):
    from vllm import SamplingParams

    extra = {"xconf_forced_tokens": forced} if forced is not None else None
    return SamplingParams(max_tokens=4, extra_args=extra)


def test_forces_by_live_output_position() -> None:
    import torch

    proc = _processor()
    out0: list[int] = []
    out1: list[int] = []
    _update(proc, added=[(0, _params([3, 5]), [1], out0), (1, _params(None), [1], out1)])
    logits = proc.apply(torch.zeros(2, 8))
    assert int(logits[0].argmax()) == 3 and torch.isinf(logits[0]).sum() == 7
    assert torch.equal(logits[1], torch.zeros(8))  # unforced row untouched
    out0.append(3)  # vLLM appends to the live list
    assert int(proc.apply(torch.zeros(2, 8))[0].argmax()) == 5
    out0.append(5)
    assert torch.equal(proc.apply(torch.zeros(2, 8))[0], torch.zeros(8))  # past the end


def test_remove_add_move_and_swap() -> None:
    import torch
    from vllm.v1.sample.logits_processor import MoveDirectionality

    proc = _processor()
    a: list[int] = []
    b: list[int] = []
    _update(proc, added=[(0, _params([1]), [9], a), (1, _params([2]), [9], b)])
    _update(proc, moved=[(0, 1, MoveDirectionality.SWAP)])
    got = proc.apply(torch.zeros(2, 4)).argmax(-1).tolist()
    assert got == [2, 1]
    _update(proc, removed=[0], moved=[(1, 0, MoveDirectionality.UNIDIRECTIONAL)])
    got = proc.apply(torch.zeros(2, 4))
    assert int(got[0].argmax()) == 1 and torch.equal(got[1], torch.zeros(4))


def test_invalid_forced_tokens_rejected() -> None:
    from xconf.adapters.vllm.forcing import ForcedTokensLogitsProcessor

    with pytest.raises(ValueError):
        ForcedTokensLogitsProcessor.validate_params(_params(["x"]))


def test_not_argmax_invariant() -> None:
    assert _processor().is_argmax_invariant() is False
