"""Catalog registration of the vocab-parallel backend and its runtime callable."""

from __future__ import annotations

import torch
from _logprob_workers import inputs

from xconf.operators.catalog import (
    SELECTED_LOGPROB,
    OperatorBinding,
    ResolutionPolicy,
    SemanticOperatorCatalog,
)
from xconf.operators.dispatch import OperatorSession
from xconf.ops.logprob.descriptors import descriptors


def test_descriptors_declare_the_one_production_backend() -> None:
    (main,) = descriptors()
    assert main.backend_id == "xconf.vocab_parallel_logp"
    assert main.semantic_operation == SELECTED_LOGPROB and not main.is_smoke_only
    assert {"deterministic", "batch_invariant", "cross_tp_bitwise"} <= main.alignment_properties
    assert {c.platform for c in main.capabilities} == {"cpu", "cuda"}
    for capability in main.capabilities:
        assert capability.determinism_scopes == {"fixed_topology", "cross_tp_bitwise"}


def test_session_instantiates_a_tp1_callable() -> None:
    catalog = SemanticOperatorCatalog(descriptors())
    session = OperatorSession(catalog, ResolutionPolicy())
    logits, target, active, _ = inputs(256, 256, torch.bfloat16)
    ref = torch.log_softmax(logits.float(), -1).gather(1, target.clamp(0, 255)[:, None])
    for backend in catalog.backend_ids(SELECTED_LOGPROB):
        descriptor = catalog.get(SELECTED_LOGPROB, backend)
        assert descriptor is not None
        binding = OperatorBinding(
            SELECTED_LOGPROB,
            "training",
            backend,
            (("num_vocab_tiles", 8),) if backend.endswith("logp") else (),
            descriptor.fingerprint(),
            False,
            False,
        )
        op = session.instantiate(binding)
        out = op(logits, target, active)
        assert out.dtype == torch.float32 and out.shape == target.shape
        assert torch.all(out[~active] == 0)
        assert (out - ref.squeeze(1))[active].abs().max() <= 1e-5
