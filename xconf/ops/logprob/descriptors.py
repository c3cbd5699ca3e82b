"""Catalog entries (``xconf.operators`` entry point) for the vocab-parallel backends.

Each descriptor's capabilities are the one declaration of what the backend serves. CPU
only: that is what the tests exercise (the native kernel is CPU-only; the torch kernels
would run on CUDA, but no test checks their bits there yet).
"""

from __future__ import annotations

from xconf.operator_capability import MASK_MODES, BackendCapability
from xconf.semantic_registry import SELECTED_LOGPROB, OperatorDescriptor

VOCAB_PARALLEL_ID = "xconf.vocab_parallel_logp"
VOCAB_PARALLEL_FAST_ID = "xconf.vocab_parallel_logp_fast"
VERSION = "1"
# Bumped whenever the kernels' reduction structure changes (tile merge, block shapes).
BUILD_FINGERPRINT = "vocab_parallel_logp/fixed-tile-v1"


def descriptors() -> tuple[OperatorDescriptor, ...]:
    return (
        OperatorDescriptor(
            semantic_operation=SELECTED_LOGPROB,
            backend_id=VOCAB_PARALLEL_ID,
            factory="xconf.ops.logprob.selected:VocabParallelSelectedLogprob",
            version=VERSION,
            capabilities=(
                BackendCapability(
                    platform="cpu",
                    tier="production",
                    mask_modes=frozenset(MASK_MODES),
                    determinism_scopes=frozenset({"fixed_topology", "cross_tp_bitwise"}),
                ),
            ),
            alignment_properties=frozenset(
                {"deterministic", "batch_invariant", "cross_tp_bitwise", "fp32_accumulation"}
            ),
            build_fingerprint=BUILD_FINGERPRINT,
        ),
        OperatorDescriptor(
            semantic_operation=SELECTED_LOGPROB,
            backend_id=VOCAB_PARALLEL_FAST_ID,
            factory="xconf.ops.logprob.selected:VocabParallelSelectedLogprobFast",
            version=VERSION,
            capabilities=(
                BackendCapability(
                    platform="cpu",
                    tier="production",
                    mask_modes=frozenset(MASK_MODES),
                    determinism_scopes=frozenset({"fixed_topology"}),
                ),
            ),
            alignment_properties=frozenset({"fp32_accumulation"}),
            build_fingerprint=BUILD_FINGERPRINT,
        ),
    )
