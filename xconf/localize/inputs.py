"""What localization needs from a run directory, read and checked before anything runs.

The case's plan row and the baseline's, the newest valid sealed attempt of the case, its
frozen identity (whose digest must match the one the attempt sealed) and the runtime the
run used, with the options it was built with (``actual.json``'s provenance). Every refusal
is a coded :class:`LocalizeError` (exit 2) and nothing is written.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xconf.artifacts.layout import parse_json, read_plan_lines, read_regular
from xconf.artifacts.plan_seal import extensions
from xconf.artifacts.store import ExperimentStore
from xconf.config.identity import parse_identity
from xconf.errors import ArtifactError, XconfError
from xconf.experiment import Case, Identity
from xconf.localize.errors import LocalizeError


@dataclass(frozen=True)
class RunInputs:
    """A case to localize and the baseline whose two runs measure the noise floor."""

    store: ExperimentStore
    case: Case
    baseline: Case
    attempt_id: str
    attempt_path: Path
    identity: Identity
    runtime_kind: str
    # actual.json's provenance.runtime: {"target", "kind", "options"} (None: not recorded)
    runtime_record: dict[str, Any] | None = None


def _plan_rows(store: ExperimentStore) -> list[dict[str, Any]]:
    if read_regular(store.path / "plan.jsonl") is None:
        raise LocalizeError("localize.no_plan", "the run has no plan.jsonl", str(store.path))
    rows = [  # the bounded reader: a torn or hostile line is skipped, never parsed unbounded
        row
        for _, row in read_plan_lines(store.path / "plan.jsonl")
        if isinstance(row, dict) and isinstance(row.get("case_id"), str)
    ]
    # Cases added later (the fix search's arms), sealed as plan extensions.
    rows += [r for r in extensions(store.path).rows if isinstance(r.get("case_id"), str)]
    return rows


def case_from_row(row: dict[str, Any], where: str) -> Case:
    try:
        return Case(
            case_id=str(row["case_id"]),
            index=int(row["index"]),
            kind=row["kind"],
            changed=tuple(sorted(dict(row["changed"]).items())),
            knobs=tuple(sorted(dict(row["knobs"]).items())),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise LocalizeError("localize.bad_plan_row", f"malformed plan row: {exc}", where) from exc


def _document(path: Path) -> Any:
    data = read_regular(path)
    if data is None:
        raise LocalizeError("localize.attempt_unreadable", f"{path.name} is missing", str(path))
    try:
        return parse_json(data, path.name, str(path))
    except ArtifactError as exc:
        raise LocalizeError(
            "localize.attempt_unreadable", f"{path.name}: {exc.message}", str(path)
        ) from exc


def load_inputs(run_dir: Path, case_id: str) -> RunInputs:
    from xconf.verify import open_run_dir

    store = open_run_dir(run_dir)
    rows = _plan_rows(store)
    by_id = {r["case_id"]: r for r in rows}
    if case_id not in by_id:
        raise LocalizeError(
            "localize.unknown_case",
            f"case {case_id!r} is not in plan.jsonl ({len(by_id)} planned cases)",
            "CASE_ID",
        )
    baselines = [r for r in rows if r.get("kind") == "baseline"]
    if not baselines:
        raise LocalizeError("localize.no_baseline", "plan.jsonl has no baseline case", "plan.jsonl")
    case = case_from_row(by_id[case_id], f"plan.jsonl:{case_id}")
    baseline = case_from_row(baselines[0], "plan.jsonl:baseline")
    check = None
    for path in store.attempts(case_id):
        candidate = store.verify_attempt(path)
        if candidate.valid:
            check = candidate
            break
    if check is None:
        raise LocalizeError(
            "localize.no_sealed_attempt",
            f"case {case_id} has no valid sealed attempt: run it first",
            f"cases/{case_id}",
        )
    document = _document(check.path / "identity.json")
    sealed_digest = document.pop("sha256", None) if isinstance(document, dict) else None
    try:
        identity = parse_identity(document)
    except XconfError as exc:
        raise LocalizeError(
            "localize.bad_identity", f"identity.json: {exc.message}", str(check.path)
        ) from exc
    if identity.digest() != sealed_digest:
        raise LocalizeError(
            "localize.bad_identity",
            "identity.json does not match the digest it records",
            str(check.path / "identity.json"),
        )
    materialized = _document(check.path / "materialized.json")
    kind = materialized.get("runtime_kind") if isinstance(materialized, dict) else None
    if not isinstance(kind, str):
        raise LocalizeError(
            "localize.attempt_unreadable",
            "materialized.json names no runtime_kind",
            str(check.path),
        )
    actual = _document(check.path / "actual.json")
    provenance = actual.get("provenance") if isinstance(actual, dict) else None
    recorded = provenance.get("runtime") if isinstance(provenance, dict) else None
    return RunInputs(
        store,
        case,
        baseline,
        check.attempt_id,
        check.path,
        identity,
        kind,
        recorded if isinstance(recorded, dict) else None,
    )
