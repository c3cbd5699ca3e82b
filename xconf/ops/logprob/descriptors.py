"""Catalog entries (``xconf.operators`` entry point) for the vocab-parallel backends."""

from __future__ import annotations

from xconf.ops.logprob.builtin import VOCAB_PARALLEL_FAST_ID, VOCAB_PARALLEL_ID
from xconf.semantic_registry import SELECTED_LOGPROB, OperatorDescriptor

VERSION = "1"
# Bumped whenever the kernels' reduction structure changes (tile merge, block shapes);
# v2: the native build merges in its own kernel; Triton kernels on CUDA.
BUILD_FINGERPRINT = "vocab_parallel_logp/fixed-tile-v2"


def descriptors() -> tuple[OperatorDescriptor, ...]:
    return (
        OperatorDescriptor(
            semantic_operation=SELECTED_LOGPROB,
            backend_id=VOCAB_PARALLEL_ID,
            factory="xconf.ops.logprob.selected:VocabParallelSelectedLogprob",
            version=VERSION,
            devices=frozenset({"cpu", "cuda"}),
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
            devices=frozenset({"cpu", "cuda"}),
            alignment_properties=frozenset({"fp32_accumulation"}),
            build_fingerprint=BUILD_FINGERPRINT,
        ),
    )
