"""xconf's own declared selected-logprob backends and their capabilities."""

from __future__ import annotations

from dataclasses import replace

from xconf.ops.logprob.capability import BackendCapability
from xconf.ops.logprob.contract import (
    LOGITS_DTYPES,
    MASK_MODES,
    ROLES,
    LogitsDtype,
    MaskMode,
    Role,
)

VOCAB_PARALLEL_ID = "xconf.vocab_parallel_logp"
VOCAB_PARALLEL_FAST_ID = "xconf.vocab_parallel_logp_fast"
REFERENCE_ID = "xconf.reference_logp"

_ALL_ROLES: frozenset[Role] = frozenset(ROLES)
_ALL_DTYPES: frozenset[LogitsDtype] = frozenset(LOGITS_DTYPES)
_ALL_MASKS: frozenset[MaskMode] = frozenset(MASK_MODES)


def builtin_capabilities() -> tuple[tuple[str, str, BackendCapability], ...]:
    """(backend id, factory import path, capability).

    The vocab-parallel backends are declared on ``cpu`` (native/compiled/eager kernels) and
    on ``cuda`` (the Triton kernels, whose cases ``tests/ops/test_triton_interpreter.py``
    runs under Triton's interpreter in every ``make test``); the reference on ``cpu``.
    """
    return tuple(
        (backend_id, factory, replace(cap, platform=platform))
        for backend_id, factory, cap in _declared()
        for platform in (("cpu", "cuda") if backend_id != REFERENCE_ID else ("cpu",))
    )


def _declared() -> tuple[tuple[str, str, BackendCapability], ...]:
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
