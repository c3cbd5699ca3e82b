"""The sealed plan: plan.jsonl written once, its SHA-256 recorded in experiment.json, and its
sealed extensions (cases added later: :mod:`xconf.artifacts.plan_extension`).

Swapping or editing plan rows would relabel verdicts in the report, so the plan is sealed like
an attempt: run, verify and report recompute its digest (reading it without following a
symlink) and refuse or flag a mismatch. A rerun under the same experiment id must plan the same
cases (or a subset of them, as one job of a sweep does); a different plan is an
``experiment_conflict`` that names the difference and the way out. Torch-free.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from xconf.artifacts.layout import (
    HEADER_NAME,
    PLAN_NAME,
    parse_json,
    read_plan_lines,
    read_regular,
)
from xconf.artifacts.plan_extension import Extensions, extension_rows
from xconf.errors import ArtifactError

PLAN_DIGEST_KEY = "plan_sha256"


def plan_bytes(rows: Sequence[Mapping[str, Any]]) -> bytes:
    return b"".join(
        json.dumps(row, sort_keys=True, allow_nan=False).encode() + b"\n" for row in rows
    )


def plan_digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def plan_seal_problem(experiment_dir: Path) -> str | None:
    """Why plan.jsonl does not match the digest sealed in experiment.json (None: it does)."""
    try:
        header_bytes = read_regular(experiment_dir / HEADER_NAME)
        data = read_regular(experiment_dir / PLAN_NAME)
    except ArtifactError as exc:
        return exc.message
    if header_bytes is None:
        return "experiment.json is missing"
    try:
        header = parse_json(header_bytes, HEADER_NAME)
    except ArtifactError:
        return "experiment.json does not parse"
    sealed = header.get(PLAN_DIGEST_KEY) if isinstance(header, dict) else None
    if not isinstance(sealed, str):
        return f"experiment.json seals no plan ({PLAN_DIGEST_KEY} missing)"
    if data is None:
        return f"{PLAN_NAME} is missing"
    if plan_digest(data) != sealed:
        return f"{PLAN_NAME} does not match the digest sealed in experiment.json"
    rows = [r for _, r in read_plan_lines(experiment_dir / PLAN_NAME) if isinstance(r, dict)]
    added = extensions(experiment_dir)
    if added.problems:
        return added.problems[0]
    return _duplicate_problem(rows, added.rows) or rows_problem([*rows, *added.rows])


def extensions(experiment_dir: Path) -> Extensions:
    """The sealed extensions of the run's plan (:mod:`xconf.artifacts.plan_extension`), read
    against the header's experiment id and plan digest."""
    try:
        header_bytes = read_regular(experiment_dir / HEADER_NAME)
        header = json.loads(header_bytes.decode("utf-8")) if header_bytes is not None else None
    except (ArtifactError, ValueError, UnicodeDecodeError):
        header = None
    if not isinstance(header, dict):
        return Extensions((), ())
    experiment_id = header.get("experiment_id")
    digest = header.get(PLAN_DIGEST_KEY)
    return extension_rows(
        experiment_dir,
        experiment_id if isinstance(experiment_id, str) else "",
        digest if isinstance(digest, str) else None,
    )


def _duplicate_problem(
    rows: Sequence[Mapping[str, Any]], added: Sequence[Mapping[str, Any]]
) -> str | None:
    """An extension row naming a case id the plan (or an earlier extension) holds with other
    knobs, operators or changes: one of the two was edited (None: each id has one row)."""
    seen = {r.get("case_id"): r for r in rows}
    for row in added:
        before = seen.get(row.get("case_id"))
        if before is not None and any(
            before.get(k) != row.get(k) for k in ("knobs", "operators", "changed")
        ):
            return (
                f"a plan extension lists case {row.get('case_id')!r} with other knobs than "
                f"{PLAN_NAME} or an earlier extension"
            )
        seen.setdefault(row.get("case_id"), row)
    return None


def rows_problem(rows: Sequence[Mapping[str, Any]]) -> str | None:
    """A row whose declared changes are not what its knobs change from the baseline's: the
    label the report shows and the declared set the verdict's not-applied / confounded split
    rests on would be another case's (None: every row declares exactly its own changes)."""
    base = next((r for r in rows if r.get("kind") == "baseline"), None)
    base_knobs = base.get("knobs") if base is not None else None
    if not isinstance(base_knobs, dict):
        return None  # no baseline row to tell changes from: the digest is all there is
    for row in rows:
        changed, knobs = row.get("changed"), row.get("knobs")
        if not isinstance(changed, dict) or not isinstance(knobs, dict):
            return f"{PLAN_NAME} row {row.get('case_id')!r} has no knobs or changes"
        moved = {k for k in set(knobs) | set(base_knobs) if knobs.get(k) != base_knobs.get(k)}
        declared = {k for k, v in changed.items() if knobs.get(k) == v}
        if set(changed) != moved or declared != moved:
            return (
                f"{PLAN_NAME} row {row.get('case_id')!r} declares {_show(row)}, but its knobs "
                f"change {sorted(moved) or 'nothing'} from the baseline"
            )
    return None


def sealed_rows(experiment_dir: Path) -> dict[str, dict[str, Any]]:
    """The sealed plan's rows by case id; raises ``artifacts.plan_seal`` if it is not sealed."""
    problem = plan_seal_problem(experiment_dir)
    if problem is not None:
        raise ArtifactError("artifacts.plan_seal", problem, str(experiment_dir / PLAN_NAME))
    rows: dict[str, dict[str, Any]] = {}
    for _, row in read_plan_lines(experiment_dir / PLAN_NAME):  # bounded, depth-limited parse
        if isinstance(row, dict) and isinstance(row.get("case_id"), str):
            rows[row["case_id"]] = row
    for row in extensions(experiment_dir).rows:  # cases added later (the fix search)
        if isinstance(row.get("case_id"), str):
            rows.setdefault(row["case_id"], row)
    return rows


def _show(row: Mapping[str, Any]) -> str:
    changed = row.get("changed") or {}
    return ", ".join(f"{k}={v}" for k, v in sorted(changed.items())) or "baseline"


def plan_difference(
    existing: Mapping[str, Mapping[str, Any]], rows: Sequence[Mapping[str, Any]]
) -> str | None:
    """What makes ``rows`` a different plan than the sealed one (None: same plan or a subset).

    A case id is the digest of the case's knobs and operators, so a sealed row with this id
    holds this row's knobs and operators; one that does not was edited and resealed (its
    label and its declared changes would be believed for this case's verdict). Its index and
    kind may differ, and its changes where this row declares none: a sweep job plans its case
    alone, as a baseline of its own.
    """
    for row in rows:
        sealed = existing.get(row["case_id"])
        compared = (
            ("knobs", "operators", "changed") if row.get("changed") else ("knobs", "operators")
        )
        relabelled = [k for k in compared if sealed and sealed.get(k) != row.get(k)]
        if sealed is not None and relabelled:
            return (
                f"the sealed row of {row['case_id']} holds other {' and '.join(relabelled)} "
                f"({_show(sealed)}) than the case it names ({_show(row)}): plan.jsonl was "
                "edited after it was planned"
            )
    new = [row for row in rows if row["case_id"] not in existing]
    if not new:
        return None
    parts = []
    old_base = next((r for r in existing.values() if not r.get("changed")), None)
    new_base = next((r for r in new if not r.get("changed")), None)
    if old_base is not None and new_base is not None:
        before, after = old_base.get("knobs") or {}, new_base.get("knobs") or {}
        moved = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        shown = ", ".join(f"{k}: {before.get(k)!r} -> {after.get(k)!r}" for k in moved)
        parts.append(f"the baseline differs ({shown or 'another identity or contract'})")
    others = [r for r in new if r is not new_base]
    if others:
        parts.append(f"cases not in the sealed plan: {', '.join(_show(r) for r in others[:5])}")
    return "; ".join(parts)
