"""Catalog entries (``xconf.operators`` entry point) for the vocab-parallel backends."""

from __future__ import annotations

from xconf.semantic_registry import SELECTED_LOGPROB, OperatorDescriptor

# The backend ids live here, not in builtin.py: the catalog loads this module while planning,
# and nothing on that path may import torch (builtin.py pulls in the torch-typed contract).
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
            devices=frozenset({"cpu"}),
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
            devices=frozenset({"cpu"}),
            alignment_properties=frozenset({"fp32_accumulation"}),
            build_fingerprint=BUILD_FINGERPRINT,
        ),
    )
