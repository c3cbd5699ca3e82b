"""The rows of a run: one :class:`CaseRecord` per case, gathered in a :class:`RunSummary`,
and the :class:`RunStep` a run reports between them (its progress, for a log)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal


@dataclass(frozen=True)
class CaseRecord:
    """One row of the verdict table."""

    case_id: str
    label: str
    kind: str
    attempt_id: str
    result: str
    reused: bool
    active_tokens: int
    mismatches: int
    max_abs_diff: float | None
    p99_abs_diff: float | None
    reason: str | None
    # False when a declared knob was not run as requested (only possible without strict
    # execution): the verdict stands but says nothing about the knob.
    intervention_applied: bool = True
    # side:knob of each knob that was not the intervention and did not run as set (only
    # possible without strict execution): the case measured something else too.
    confounded: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The record as JSON values (a sweep job's answer crosses a launcher as JSON, which
        has no tuple)."""
        return {**asdict(self), "confounded": list(self.confounded)}

    @classmethod
    def from_json(cls, values: Mapping[str, Any], **override: Any) -> CaseRecord:
        """The record :meth:`to_json` gave (other keys ignored), with ``override`` applied."""
        names = {f.name for f in fields(cls)}
        known = {k: v for k, v in values.items() if k in names}
        known["confounded"] = tuple(known.get("confounded", ()))
        return cls(**{**known, **override})

    @classmethod
    def from_comparison(
        cls,
        doc: Mapping[str, Any],
        *,
        case_id: str,
        label: str,
        kind: str,
        attempt_id: str,
        reused: bool,
    ) -> CaseRecord:
        """The row for one sealed attempt, read from its ``comparison.json`` document."""
        diff = doc.get("diff") or {}
        intervention = doc.get("intervention") or {}
        return cls(
            case_id=case_id,
            label=label,
            kind=kind,
            attempt_id=attempt_id,
            result=doc["result"],
            reused=reused,
            active_tokens=int(doc.get("active_tokens") or 0),
            mismatches=int(doc.get("mismatches") or 0),
            max_abs_diff=diff.get("max"),
            p99_abs_diff=diff.get("p99"),
            reason=doc.get("reason"),
            intervention_applied=bool(intervention.get("applied", True)),
            confounded=tuple(
                f"{c.get('side')}:{c.get('path')}"
                for c in intervention.get("confounded") or ()
                if isinstance(c, dict)
            ),
        )


@dataclass(frozen=True)
class RunStep:
    """A step of a run between its finished cases: the identity frozen (``identity``, before
    the first case starts) or an engine built for a case (``engine``), and its seconds."""

    kind: Literal["identity", "engine"]
    what: str
    seconds: float


@dataclass
class RunSummary:
    experiment_id: str
    experiment_dir: str
    records: list[CaseRecord] = field(default_factory=list)
    engines_built: int = 0
    engines_reused: int = 0
    sides_reused: int = 0  # sides that took the scores of a side scored alike in this run
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def all_pass(self) -> bool:
        return all(r.result == "pass" for r in self.records)
