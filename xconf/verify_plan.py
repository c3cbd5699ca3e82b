"""What `xconf verify` checks an attempt against beyond its own records, offline: the sealed
plan row of its case, the experiment header, and the one frozen identity of the experiment.

A forger who edits a record and recomputes every digest (the seal, the execution key, the
identity's inner sha256, the plan's seal) still leaves the attempt disagreeing with the rest
of the run: requested.json's knobs with the plan row that labels the case (an attempt of
another case copied in, its ids rewritten), comparison.json's contract with the header's,
one attempt's frozen identity with every other's. A resume compares the same records with
what the run derives now (:mod:`xconf.runtime.rederive`); here only the run directory is read.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from xconf.artifacts.layout import COMPARISON_NAME
from xconf.artifacts.layout import read_json as read_bounded_json

SIDES = ("rollout", "training")


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _object(path: Path) -> dict[str, Any]:
    return _mapping(read_bounded_json(path))


def plan_row_problems(
    attempt: Path, row: Mapping[str, Any] | None, header: Mapping[str, Any]
) -> list[str]:
    """How a scored attempt disagrees with its case's sealed plan row and the experiment
    header (its own records were checked and are readable JSON objects; a judged dump's
    rules are :mod:`xconf.judge.records`)."""
    requested = _object(attempt / "requested.json")
    problems = []
    if row is not None:
        for key in ("knobs", "changed"):
            said, planned = _mapping(requested.get(key)), _mapping(row.get(key))
            wrong = sorted(k for k in said | planned if said.get(k) != planned.get(k))
            if wrong or requested.get(key) != row.get(key):
                problems.append(
                    f"requested.json {key} differ from the case's row in plan.jsonl: {wrong}"
                )
        operators, planned_ops = (
            _mapping(requested.get("operators")),
            _mapping(row.get("operators")),
        )
        for side in SIDES:
            backend = _mapping(operators.get(side)).get("backend_id")
            if backend != planned_ops.get(side):
                problems.append(
                    f"requested.json binds {side} operator {backend!r}, plan.jsonl "
                    f"{planned_ops.get(side)!r}"
                )
    contract = _mapping(header.get("contract"))
    judged = _mapping(_object(attempt / COMPARISON_NAME).get("contract"))
    for key in ("version", "sha256"):
        if judged.get(key) != contract.get(key):
            problems.append(
                f"comparison.json contract {key} {judged.get(key)!r} is not experiment.json's "
                f"{contract.get(key)!r}"
            )
    return problems


def identity_digest(attempt: Path) -> str | None:
    """The frozen identity a scored attempt scored (a judged dump is its own identity)."""
    digest = _object(attempt / "identity.json").get("sha256")
    return digest if isinstance(digest, str) else None


def identity_split(digests: Mapping[str, str]) -> str | None:
    """``digests``: attempt (``case/a-NNNN``) -> frozen identity digest of each verdict. One
    experiment holds one frozen identity; None when it does, else which attempts differ."""
    groups: dict[str, list[str]] = {}
    for attempt, digest in sorted(digests.items()):
        groups.setdefault(digest, []).append(attempt)
    if len(groups) < 2:
        return None
    largest = max(groups.values(), key=len)
    others = sorted(a for members in groups.values() if members is not largest for a in members)
    return (
        f"the experiment's verdicts were scored on {len(groups)} frozen identities: "
        f"{', '.join(others[:5])} differ from the other {len(largest)}"
    )
