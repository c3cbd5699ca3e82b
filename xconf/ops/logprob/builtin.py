"""xconf's own declared selected-logprob backends and their capabilities."""

from __future__ import annotations

from xconf.ops.logprob.capability import BackendCapability
from xconf.ops.logprob.contract import (
    LOGITS_DTYPES,
    MASK_MODES,
    ROLES,
    LogitsDtype,
    MaskMode,
    Role,
)
from xconf.ops.logprob.descriptors import VOCAB_PARALLEL_FAST_ID, VOCAB_PARALLEL_ID

REFERENCE_ID = "xconf.reference_logp"

_ALL_ROLES: frozenset[Role] = frozenset(ROLES)
_ALL_DTYPES: frozenset[LogitsDtype] = frozenset(LOGITS_DTYPES)
_ALL_MASKS: frozenset[MaskMode] = frozenset(MASK_MODES)


def builtin_capabilities() -> tuple[tuple[str, str, BackendCapability], ...]:
    """(backend id, factory import path, capability); CPU only: that is what is tested."""
    return (
        (
            VOCAB_PARALLEL_ID,
            "xconf.ops.logprob.vocab_parallel:vocab_parallel_selected_logprob",
            BackendCapability(
                backend_id=VOCAB_PARALLEL_ID,
                platform="cpu",
                tier="production",
                roles=_ALL_ROLES,
                dtypes=_ALL_DTYPES,
                mask_modes=_ALL_MASKS,
                determinism_scopes=frozenset({"fixed_topology", "cross_tp_bitwise"}),
            ),
        ),
        (
            VOCAB_PARALLEL_FAST_ID,
            "xconf.ops.logprob.vocab_parallel:vocab_parallel_selected_logprob_fast",
            BackendCapability(
                backend_id=VOCAB_PARALLEL_FAST_ID,
                platform="cpu",
                tier="production",
                roles=_ALL_ROLES,
                dtypes=_ALL_DTYPES,
                mask_modes=_ALL_MASKS,
                determinism_scopes=frozenset({"fixed_topology"}),
            ),
        ),
        (
            REFERENCE_ID,
            "xconf.ops.reference:ReferenceSelectedLogprob",
            BackendCapability(
                backend_id=REFERENCE_ID,
                platform="cpu",
                tier="reference",
                roles=_ALL_ROLES,
                dtypes=_ALL_DTYPES,
                mask_modes=frozenset({"explicit_active_mask"}),
                determinism_scopes=frozenset({"fixed_topology"}),
                supports_padding=False,
                tp_sizes=frozenset({1}),
                cp_sizes=frozenset({1}),
            ),
        ),
    )
