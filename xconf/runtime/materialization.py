"""Facade over adapters: the default bind, settings, fingerprints, actual-stage readback and
strict-execution checks."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields, replace
from typing import TYPE_CHECKING, Any, TypeVar

from xconf.canonical import canonical_digest
from xconf.errors import RuntimeMaterializationError
from xconf.knobs import (
    DERIVED_KNOBS,
    DTYPES,
    KNOBS,
    LOGP_BACKEND,
    ROLLOUT_DTYPE,
    TRAINING_COMPUTE_DTYPE,
    KnobValue,
    side_dtype,
)
from xconf.operators.catalog import SIDES, OperatorBinding, Side
from xconf.runtime.protocol import (
    Handlers,
    KnobApplication,
    KnobRequest,
    ReadbackFailure,
    ReadbackValue,
    RuntimeBinding,
    RuntimeView,
    SideBinding,
    unsupported_application,
)
from xconf.runtime.settings import setting_name

if TYPE_CHECKING:
    from xconf.execution_plan import ExecutionCase

S = TypeVar("S")  # a side's settings record (``runtime/side.SideSpec.settings``)

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


def materialize(
    handlers: Handlers,
    runtime: RuntimeView,
    path: str,
    side: Side,
    value: KnobValue,
    knobs: Mapping[str, KnobValue],
) -> KnobApplication:
    """One requested knob through the runtime's handler; a knob the runtime declares no
    handler for is ``unsupported``, never applied."""
    handler = handlers.get(path)
    if handler is None:
        return unsupported_application(
            path, side, value, f"the {runtime.runtime_kind} runtime has no {path}"
        )
    return handler.materialize(KnobRequest(KNOBS[path], side, value, knobs, runtime))


def default_bind(
    runtime: RuntimeView,
    handlers: Mapping[Side, Handlers],
    case: ExecutionCase,
    contexts: Mapping[Side, tuple[tuple[str, Any], ...]],
    scorers: tuple[tuple[str, str], ...],
) -> RuntimeBinding:
    """Requested -> materialized for every knob of the case on each side (``logp.backend``
    is the operator binding's: ``backend_application``), through that side's handlers."""
    knobs = case.case.knob_dict()
    sides = {
        side: SideBinding(
            side,
            tuple(
                materialize(handlers[side], runtime, path, side, value, knobs)
                for path, value in sorted(knobs.items())
                if path != LOGP_BACKEND.path and KNOBS[path].side in (side, "both")
            ),
            side_dtype(knobs, side),
            contexts[side],
        )
        for side in SIDES
    }
    return RuntimeBinding(
        runtime_kind=runtime.runtime_kind,
        case_id=case.case.case_id,
        rollout=sides["rollout"],
        training=sides["training"],
        scorers=scorers,
    )


def settings_for(binding: SideBinding, kind: type[S]) -> S:
    """The side's settings from its bound knobs: each knob's materialized value in the field
    ``setting_name`` names. A knob the case does not declare, or one the side materialized
    nothing for (``unsupported``: the case is refused under strict execution, and marked
    "not applied" without it), keeps the field's default: the engine is built as it would
    be without the knob, and its readback says what ran."""
    names = {f.name for f in fields(kind)}  # type: ignore[arg-type]
    values: dict[str, Any] = {}
    for knob in binding.knobs:
        if knob.materialized is None:
            continue
        name = setting_name(KNOBS[knob.path])
        if name not in names:  # a knob of the other side, or settings of the other side
            raise RuntimeMaterializationError(
                "runtime.knob_side",
                f"{knob.path} is no field of {kind.__name__}",
                f"{binding.side}:{knob.path}",
            )
        values[name] = knob.materialized
    return replace(kind(), **values)  # type: ignore[type-var]


def apply_readback(
    side: SideBinding, readback: Mapping[str, ReadbackValue]
) -> tuple[KnobApplication, ...]:
    """The actual stage: values read from the live engine, never echoed from the request."""
    actual: list[KnobApplication] = []
    for knob in side.knobs:
        if knob.status in REJECTED_STATUSES:
            actual.append(knob)
            continue
        failed = readback.get(knob.path)
        if isinstance(failed, ReadbackFailure):
            actual.append(
                replace(knob, actual=None, status="error", evidence=f"{knob.evidence}; {failed}")
            )
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
        # A derived record is never a knob value; a float is (training.temperature's divisor).
        if not isinstance(value, bool | int | float | str):
            raise RuntimeMaterializationError(
                "runtime.readback_type",
                f"engine read back a {type(value).__name__} for a knob",
                f"{side.side}:{knob.path}",
            )
        if _same(value, knob.materialized):
            actual.append(replace(knob, actual=value))
        elif _same(value, knob.requested):
            # The requested value names the implementation the engine runs (the declared
            # intervention *is* the fallback implementation): it was honoured, not replaced.
            actual.append(
                replace(
                    knob,
                    actual=value,
                    evidence=f"engine runs {value!r}, the requested implementation itself",
                )
            )
        else:
            actual.append(
                replace(
                    knob,
                    actual=value,
                    status="fallback",
                    evidence=f"engine runs {value!r}, {knob.materialized!r} was set"
                    + _readings(knob.path, readback),
                )
            )
    return tuple(actual)


def _same(read: KnobValue, value: KnobValue | None) -> bool:
    """Equal as knob values: Python's ``True == 1`` is not an engine reading back 1 for a flag
    (or ``True`` for a size)."""
    return read == value and isinstance(read, bool) == isinstance(value, bool)


def _readings(path: str, readback: Mapping[str, ReadbackValue]) -> str:
    """The engine readings the knob's readback depends on, as ``; name=value`` (or empty)."""
    names = KNOBS[path].evidence_readings
    return "".join(f"; {name}={readback.get(name)!r}" for name in names)


def strict_violations(
    applications: tuple[KnobApplication, ...], *, strict_fallback: bool
) -> list[str]:
    """Reasons strict execution refuses these applications (empty: acceptable).

    Under strict execution a critical knob that fell back, is unsupported or cannot be observed
    makes the case an error, on the case's declared knob as on any other: a declared value the
    engine did not honour measures nothing. (A requested value that names the fallback
    implementation itself is ``applied`` by ``apply_readback``, so it never arrives here.)
    Each reason starts with ``side:knob``.
    """
    reasons = []
    for app in applications:
        where = f"{app.side}:{app.path}"
        if app.status in REJECTED_STATUSES:
            reasons.append(f"{where} is {app.status} ({app.evidence})")
        elif not strict_fallback or not KNOBS[app.path].critical:
            continue
        elif app.status == "fallback":
            reasons.append(f"{where} fell back ({app.evidence})")
        elif app.status == "unobservable":
            reasons.append(
                f"{where} is a critical knob the runtime cannot observe ({app.evidence})"
            )
    return reasons


def refusal(reasons: list[str]) -> RuntimeMaterializationError:
    """The case error for strict refusals: its path names the first refused ``side:knob``."""
    return RuntimeMaterializationError(
        "runtime.strict_refused", "; ".join(reasons), path=reasons[0].split(" ")[0]
    )


def not_applied(
    applications: tuple[KnobApplication, ...], declared: frozenset[str]
) -> list[dict[str, object]]:
    """Declared (changed) knobs whose value the engine did not run, with the evidence.

    Without strict execution such a case keeps its verdict but is marked "intervention not
    applied": it never counts as evidence about the knob.
    """
    return [
        {"side": a.side, "path": a.path, "status": a.status, "evidence": a.evidence}
        for a in applications
        if a.path in declared and a.status != "applied"
    ]


def confounded(
    applications: tuple[KnobApplication, ...], declared: frozenset[str]
) -> list[dict[str, object]]:
    """Knobs the case did not declare that the engine did not run as set (what strict
    execution would refuse): without strict execution the case is measured, but what it
    measures is confounded by them, and it says so, naming each."""
    return [
        {"side": a.side, "path": a.path, "status": a.status, "evidence": a.evidence}
        for a in applications
        if a.path not in declared
        and (
            a.status == "fallback"
            or (a.status == "unobservable" and KNOBS[a.path].critical)
            or a.status in REJECTED_STATUSES
        )
    ]


def ran_dtypes(
    applications: tuple[KnobApplication, ...], requested: tuple[str, str]
) -> tuple[str, str]:
    """(rollout, training) dtypes the engines read back as running; the requested one where
    a side's dtype was not observed. The threshold follows what ran, not what was set."""
    found = dict(zip(("rollout", "training"), requested, strict=True))
    for app in applications:
        if app.path in DTYPE_KNOBS and app.actual in DTYPES:
            found[DTYPE_KNOBS[app.path]] = app.actual
    return found["rollout"], found["training"]


DTYPE_KNOBS = {ROLLOUT_DTYPE.path: "rollout", TRAINING_COMPUTE_DTYPE.path: "training"}


def check_pre_build(binding: RuntimeBinding, *, strict_fallback: bool) -> None:
    """Refuse before any engine is built when a requested setting would be ignored."""
    reasons = []
    for side in (binding.rollout, binding.training):
        # Unobservable is judged after the engine is built, on what it reads back.
        observable = tuple(k for k in side.knobs if k.status != "unobservable")
        reasons += strict_violations(observable, strict_fallback=strict_fallback)
    if reasons:
        raise refusal(reasons)


def backend_application(
    side: Side, knobs: Mapping[str, Any], operator: OperatorBinding
) -> KnobApplication:
    """``logp.backend`` through the three stages: requested, bound, instantiated.

    The operator session instantiates exactly the bound descriptor (its fingerprint is checked
    and resolution never falls back), so the backend that ran is the bound one.
    """
    requested = knobs.get(LOGP_BACKEND.path, operator.backend_id)
    if operator.runtime_native:
        how = "the runtime's own selected-logprob path"
    else:
        fingerprint = operator.descriptor_fingerprint[:12]
        how = f"operator '{operator.backend_id}' (descriptor {fingerprint})"
    mapped = "" if requested == operator.backend_id else "; an explicit operators mapping binds it"
    return KnobApplication(
        LOGP_BACKEND.path,
        side,
        KNOBS[LOGP_BACKEND.path].lifecycle,
        requested,
        operator.backend_id,
        operator.backend_id,
        "applied",
        f"scored with {how}{mapped}",
    )


def unreached_applications(side: SideBinding, exc: BaseException) -> tuple[KnobApplication, ...]:
    """The actual stage of a side the case never read back: nothing observed, status error."""
    code = getattr(exc, "code", type(exc).__name__)
    return tuple(
        knob
        if knob.status in REJECTED_STATUSES
        else replace(
            knob,
            actual=None,
            status="error",
            evidence=f"{knob.evidence}; not read back: the case stopped with {code}",
        )
        for knob in side.knobs
    )


def failed_readback(side: SideBinding, exc: BaseException) -> dict[str, ReadbackValue]:
    """Readback raised: every knob of the side was not read, each one an error with the reason."""
    from xconf.shown_text import bounded

    failure = ReadbackFailure(bounded(f"{type(exc).__name__}: {exc}"))
    return {knob.path: failure for knob in side.knobs}


def split_readback(readback: Mapping[str, ReadbackValue]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(derived values, what the engine reported) for actual.json, as plain JSON values.

    Derived values (the vocab layout the engine built, the side's world) are recorded, never
    set; a layout is written as its sharding record (real and padded vocab size, shard bounds
    per TP rank) and kept out of the reported values; a failed read is written as its reason.
    """
    derived: dict[str, Any] = {}
    reported: dict[str, Any] = {}
    for key, value in readback.items():
        to_dict = getattr(value, "to_dict", None)
        if callable(to_dict):
            derived[key] = to_dict(include_ranks=False)
            continue
        plain = str(value) if isinstance(value, ReadbackFailure) else value
        if key in DERIVED_KNOBS:
            derived[key] = plain
        reported[key] = plain
    return derived, reported
