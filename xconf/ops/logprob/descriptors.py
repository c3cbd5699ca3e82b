"""Catalog entry (``xconf.operators`` entry point) for the vocab-parallel backend.

The descriptor's capabilities are the one declaration of what the backend serves: on
``cpu`` (native, compiled and eager kernels) and on ``cuda`` (the Triton kernels, whose
cases ``tests/ops/test_triton_interpreter.py`` runs under Triton's interpreter in every
``make test``; not yet run on a GPU, see docs/operators.md).
"""

from __future__ import annotations

from xconf.operators.capability import MASK_MODES, BackendCapability, Platform
from xconf.operators.catalog import SELECTED_LOGPROB, OperatorDescriptor

VOCAB_PARALLEL_ID = "xconf.vocab_parallel_logp"
VERSION = "1"
# Bumped whenever the kernels' reduction structure changes (tile merge, block shapes);
# v2: the native build merges in its own kernel; Triton kernels on CUDA.
BUILD_FINGERPRINT = "vocab_parallel_logp/fixed-tile-v2"
DECLARED_PLATFORMS: tuple[Platform, ...] = ("cpu", "cuda")


def descriptors() -> tuple[OperatorDescriptor, ...]:
    return (
        OperatorDescriptor(
            semantic_operation=SELECTED_LOGPROB,
            backend_id=VOCAB_PARALLEL_ID,
            factory="xconf.ops.logprob.selected:VocabParallelSelectedLogprob",
            version=VERSION,
            capabilities=tuple(
                BackendCapability(
                    platform=platform,
                    tier="production",
                    mask_modes=frozenset(MASK_MODES),
                    determinism_scopes=frozenset({"fixed_topology", "cross_tp_bitwise"}),
                )
                for platform in DECLARED_PLATFORMS
            ),
            alignment_properties=frozenset(
                {"deterministic", "batch_invariant", "cross_tp_bitwise", "fp32_accumulation"}
            ),
            build_fingerprint=BUILD_FINGERPRINT,
        ),
    )
