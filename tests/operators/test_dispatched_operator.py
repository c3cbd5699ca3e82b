"""A dispatched operator binds its implementation once per call signature: the contract is
built and checked when a signature is first called, never again on later calls of it."""

from __future__ import annotations

import pytest
import torch

from xconf.errors import OperatorResolutionError
from xconf.operators.capability import BackendCapability, Platform
from xconf.operators.catalog import SELECTED_LOGPROB, OperatorDescriptor
from xconf.operators.dispatch import DispatchedOperator
from xconf.ops.logprob.contract import LogprobContract
from xconf.ops.reference import ReferenceSelectedLogprob


class CountingReference(ReferenceSelectedLogprob):
    """The reference, counting the contracts it is asked for and the calls it computes."""

    def __init__(self) -> None:
        self.contracts = 0
        self.calls = 0

    def contract_for(self, logits: torch.Tensor) -> LogprobContract:
        self.contracts += 1
        return super().contract_for(logits)

    def __call__(
        self, logits: torch.Tensor, target_ids: torch.Tensor, active_mask: torch.Tensor
    ) -> torch.Tensor:
        self.calls += 1
        return super().__call__(logits, target_ids, active_mask)


def _descriptor(platform: Platform) -> OperatorDescriptor:
    return OperatorDescriptor(
        semantic_operation=SELECTED_LOGPROB,
        backend_id="test.counting",
        factory="tests.operators.test_dispatched_operator:CountingReference",
        version="1",
        capabilities=(
            BackendCapability(
                platform=platform,
                tier="reference",
                tp_sizes=frozenset({1}),
                cp_sizes=frozenset({1}),
                supports_padding=False,
            ),
        ),
    )


def _call(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    rows = logits.shape[0]
    return torch.arange(rows) % logits.shape[-1], torch.ones(rows, dtype=torch.bool)


def test_a_signature_is_checked_once_however_many_calls() -> None:
    impl = CountingReference()
    op = DispatchedOperator(impl, _descriptor("cpu"), "training")
    logits = torch.randn(6, 16, generator=torch.Generator().manual_seed(0))
    for rows in (3, 5, 1, 3):  # the row count is no part of a contract
        op(logits[:rows], *_call(logits[:rows]))
    assert (impl.contracts, impl.calls) == (1, 4)
    # A new dtype or vocabulary width is a new signature: checked once more, then bound.
    op(logits.bfloat16(), *_call(logits))
    op(logits.bfloat16(), *_call(logits))
    op(logits[:, :8], *_call(logits[:, :8]))
    assert (impl.contracts, impl.calls) == (3, 7)


def test_an_unserved_signature_is_refused_on_every_call_without_rechecking() -> None:
    impl = CountingReference()
    op = DispatchedOperator(impl, _descriptor("cuda"), "training")
    logits = torch.randn(2, 16, generator=torch.Generator().manual_seed(1))
    for _ in range(3):
        with pytest.raises(OperatorResolutionError) as err:
            op(logits, *_call(logits))
        assert err.value.code == "operator.dispatch.incompatible_backend"
        assert "no declared capability on 'cpu'" in err.value.message
        assert err.value.path == "operators.selected_logprob.training"
    assert (impl.contracts, impl.calls) == (1, 0)  # checked when bound, never computed
