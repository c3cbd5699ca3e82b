"""Facade over adapters: fingerprints, actual-stage readback and strict-execution checks."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from xconf.canonical import canonical_digest
from xconf.errors import RuntimeMaterializationError
from xconf.knobs import KNOBS, KnobValue
from xconf.runtime.protocol import KnobApplication, RuntimeBinding, SideBinding
from xconf.semantic_registry import OperatorBinding

REJECTED_STATUSES = frozenset({"unsupported", "error"})


def with_fingerprints(
    side: SideBinding, operator: OperatorBinding, runtime_kind: str
) -> SideBinding:
    """Derive the three fingerprints from the side's knobs by lifecycle and its operator."""

    def by_lifecycle(lifecycle: str) -> dict[str, KnobValue | None]:
        return {k.path: k.materialized for k in side.knobs if k.lifecycle == lifecycle}

    distributed = canonical_digest(dict(side.distributed_context))
    process = canonical_digest(
        {
            "runtime": runtime_kind,
            "side": side.side,
            "knobs": by_lifecycle("process"),
            "distributed": distributed,
        }
    )
    construction = canonical_digest(
        {
            "runtime": runtime_kind,
            "side": side.side,
            "dtype": side.dtype,
            "knobs": by_lifecycle("engine_construction"),
            "operator": operator.to_dict(),
            "process": process,
        }
    )
    return replace(
        side,
        construction_fingerprint=construction,
        distributed_fingerprint=distributed,
        process_fingerprint=process,
    )


def apply_readback(
    side: SideBinding, readback: Mapping[str, KnobValue | None]
) -> tuple[KnobApplication, ...]:
    """The actual stage: values read from the live engine, never echoed from the request."""
    actual: list[KnobApplication] = []
    for knob in side.knobs:
        if knob.status in REJECTED_STATUSES:
            actual.append(knob)
            continue
        if knob.path not in readback or readback[knob.path] is None:
            actual.append(
                replace(
                    knob,
                    actual=None,
                    status="unobservable",
                    evidence=knob.evidence + "; engine state does not expose it",
                )
            )
            continue
        value = readback[knob.path]
        if value != knob.materialized:
            actual.append(
                replace(
                    knob,
                    actual=value,
                    status="fallback",
                    evidence=f"engine runs {value!r}, {knob.materialized!r} was set",
                )
            )
        else:
            actual.append(replace(knob, actual=value))
    return tuple(actual)


def strict_violations(
    applications: tuple[KnobApplication, ...],
    *,
    strict_fallback: bool,
    declared: frozenset[str] = frozenset(),
) -> list[str]:
    """Reasons strict execution refuses these applications (empty: acceptable).

    A fallback is measurable only when its knob is itself the case's declared intervention
    (``declared``): then the case measures what the fallback does, and actual.json records it.
    """
    reasons = []
    for app in applications:
        where = f"{app.side}:{app.path}"
        if app.status in REJECTED_STATUSES:
            reasons.append(f"{where} is {app.status} ({app.evidence})")
        elif app.status == "fallback" and strict_fallback and app.path not in declared:
            reasons.append(f"{where} fell back ({app.evidence})")
        elif app.status == "unobservable" and strict_fallback and KNOBS[app.path].critical:
            reasons.append(f"{where} is a critical knob the runtime cannot observe")
    return reasons


def check_pre_build(binding: RuntimeBinding, *, strict_fallback: bool) -> None:
    """Refuse before any engine is built when a requested setting would be ignored."""
    reasons = []
    for side in (binding.rollout, binding.training):
        # Unobservable is judged after the engine is built, on what it reads back.
        observable = tuple(k for k in side.knobs if k.status != "unobservable")
        reasons += strict_violations(observable, strict_fallback=strict_fallback)
    if reasons:
        raise RuntimeMaterializationError(
            "runtime.strict_refused", "; ".join(reasons), path=reasons[0].split(" ")[0]
        )
