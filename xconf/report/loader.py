"""Read a run directory (format ``xconf.artifacts.v1``) into typed, read-only records.

Only JSON and safetensors are read; nothing is ever unpickled. Every attempt's
``COMPLETE`` seal is verified (parses, names exactly the payload files present, no
symlinks or directories, every SHA-256 matches) and each case's newest attempt with a
verified seal is chosen. A tampered or partial attempt is kept in the record, marked
unverified with its problems, and never supplies numbers to the report.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from xconf.artifacts import seal as seal_check
from xconf.artifacts.layout import (
    HEADER_NAME,
    PLAN_NAME,
    attempt_number,
    read_json,
    read_plan_lines,
    read_regular,
)
from xconf.artifacts.plan_seal import extensions, plan_seal_problem
from xconf.errors import ArtifactError
from xconf.experiment import is_safe_id
from xconf.report.errors import ReportError

TOKEN_DIFF_KEYS = (
    "rollout_logprobs",
    "training_logprobs",
    "active_mask",
    "abs_diff",
    "mismatch_mask",
    "threshold",
)


@dataclass(frozen=True)
class SealCheck:
    """Outcome of verifying one attempt's ``COMPLETE`` seal."""

    verified: bool
    problems: tuple[str, ...]
    execution_key: str | None
    sealed_result: str | None


@dataclass(frozen=True)
class AttemptRecord:
    attempt_id: str
    path: Path
    seal: SealCheck


@dataclass(frozen=True)
class PlanRow:
    case_id: str
    index: int
    kind: str
    changed: Mapping[str, Any]
    knobs: Mapping[str, Any]
    operators: Mapping[str, Any]


@dataclass(frozen=True, eq=False)
class TokenDiffs:
    """The token-level artifact: enough to recompute the verdict offline.

    Read-only views of the file's bytes, in the dtype stored (float32, or float64 for a
    float64 verdict): a verl batch is 16M tokens, and a float64 copy of each [B, T] array
    would be most of the report's memory. Every figure widens what it computes on to
    float64 (exact), one block of rows at a time where its [B, T] temporaries would count
    (:meth:`row_blocks`), so the figures are those of float64 arrays, bit for bit.
    """

    rollout_logprobs: np.ndarray
    training_logprobs: np.ndarray
    active_mask: np.ndarray  # bool
    abs_diff: np.ndarray
    mismatch_mask: np.ndarray  # bool
    threshold: float
    token_ids: np.ndarray | None  # the selected (scored) token ids when recorded

    def row_blocks(self) -> list[slice]:
        """Row slices of about :data:`BLOCK_TOKENS` tokens each (whole rows, at least one);
        an array that is not [B, T] is one block."""
        if self.abs_diff.ndim != 2:
            return [slice(None)]
        step = max(1, BLOCK_TOKENS // max(1, self.abs_diff.shape[1]))
        return [slice(start, start + step) for start in range(0, self.abs_diff.shape[0], step)]


# Tokens per block of rows a report figure computes on at once (float64 temporaries of a
# block stay near 8 MiB whatever the batch).
BLOCK_TOKENS = 1 << 20


@dataclass(frozen=True)
class AttemptPayload:
    """The parsed payloads of one verified attempt."""

    comparison: Mapping[str, Any]
    requested: Mapping[str, Any]
    materialized: Mapping[str, Any]
    actual: Mapping[str, Any]
    identity: Mapping[str, Any]
    token_diffs: TokenDiffs | None  # None when the attempt stored no token tensors
    problems: tuple[str, ...]  # JSON payloads that do not parse
    tensor_problems: tuple[str, ...]  # tensor payloads that do not load or disagree


@dataclass(frozen=True)
class StoredCase:
    """One case as found on disk: its attempts and the one the report shows (a run's
    verdict rows are ``xconf.case_record.CaseRecord``)."""

    case_id: str
    plan_row: PlanRow | None
    attempts: tuple[AttemptRecord, ...]  # oldest first
    chosen: AttemptRecord | None  # newest attempt with a verified seal
    payload: AttemptPayload | None


@dataclass(frozen=True)
class RunRecord:
    run_dir: Path
    experiment_id: str
    header: Mapping[str, Any]
    plan: tuple[PlanRow, ...]
    cases: tuple[StoredCase, ...]
    problems: tuple[str, ...]


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def verify_seal(attempt_dir: Path, experiment_id: str, case_id: str) -> SealCheck:
    """The attempt checked by the one seal checker (``xconf.artifacts.seal``)."""
    state = seal_check.check_attempt(attempt_dir, experiment_id, case_id)
    return SealCheck(
        isinstance(state, seal_check.Sealed),
        state.problems,
        seal_check.execution_key(state),
        seal_check.sealed_result(state),
    )


def _attempt_order(attempt_id: str) -> tuple[int, str]:
    number = attempt_number(attempt_id)
    return (-1 if number is None else number, attempt_id)


def _load_tensors(path: Path) -> dict[str, np.ndarray]:
    """safetensors from a bounded regular file (no link, no FIFO, nothing oversized), as
    read-only views of the bytes read (no second copy)."""
    from xconf.artifacts.tensor_views import tensor_views

    data = read_regular(path)
    if data is None:
        raise ArtifactError("artifacts.missing", f"{path.name} is missing", str(path))
    return tensor_views(data, str(path))


def _flags(values: np.ndarray) -> np.ndarray:
    """A 0/1 array as bool: a view when it is one byte a flag, else ``astype(bool)``."""
    if values.dtype == np.uint8 and (values.size == 0 or int(values.max()) <= 1):
        return values.view(bool)
    return values.astype(bool)


def _load_token_diffs(attempt_dir: Path, problems: list[str]) -> TokenDiffs | None:
    try:
        tensors = _load_tensors(attempt_dir / "token_diffs.safetensors")
    except Exception as exc:  # safetensors raises several unrelated types on bad input
        problems.append(f"token_diffs.safetensors does not load: {exc}")
        return None
    if not tensors:  # no comparison was possible (error, invalid identity, ...)
        return None
    missing = [key for key in TOKEN_DIFF_KEYS if key not in tensors]
    if missing:
        problems.append(f"token_diffs.safetensors lacks {', '.join(missing)}")
        return None
    shape = tensors["abs_diff"].shape
    for key in TOKEN_DIFF_KEYS[:-1]:
        if tensors[key].shape != shape:
            problems.append(f"token_diffs {key} has shape {tensors[key].shape}, expected {shape}")
            return None
    token_ids: np.ndarray | None = None
    try:
        score = _load_tensors(attempt_dir / "score_rollout.safetensors")
        for key in ("selected_token_ids", "token_ids"):  # the scored token first
            ids = score.get(key)
            if ids is not None and ids.shape == shape:
                token_ids = ids
                break
    except Exception as exc:
        problems.append(f"score_rollout.safetensors does not load: {exc}")
    # float32 and float64 as stored (each figure widens exactly); anything else as before
    floats = [
        values if values.dtype in (np.float32, np.float64) else values.astype(np.float64)
        for values in (tensors[k] for k in ("rollout_logprobs", "training_logprobs", "abs_diff"))
    ]
    return TokenDiffs(
        rollout_logprobs=floats[0],
        training_logprobs=floats[1],
        active_mask=_flags(tensors["active_mask"]),
        abs_diff=floats[2],
        mismatch_mask=_flags(tensors["mismatch_mask"]),
        threshold=float(np.asarray(tensors["threshold"]).reshape(-1)[0]),
        token_ids=token_ids,
    )


def load_payload(attempt_dir: Path) -> AttemptPayload:
    """Parse a verified attempt's payloads; problems are recorded, never raised."""
    problems: list[str] = []
    docs: dict[str, Mapping[str, Any]] = {}
    for name in ("comparison", "requested", "materialized", "actual", "identity"):
        try:
            value = read_json(attempt_dir / f"{name}.json")
        except ArtifactError as exc:
            problems.append(f"{name}.json does not parse: {exc.message}")
            value = {}
        if not isinstance(value, dict):
            problems.append(f"{name}.json is not a JSON object")
        docs[name] = _mapping(value)
    tensor_problems: list[str] = []
    return AttemptPayload(
        comparison=docs["comparison"],
        requested=docs["requested"],
        materialized=docs["materialized"],
        actual=docs["actual"],
        identity=docs["identity"],
        token_diffs=_load_token_diffs(attempt_dir, tensor_problems),
        problems=tuple(problems),
        tensor_problems=tuple(tensor_problems),
    )


def _parse_plan(path: Path) -> tuple[tuple[PlanRow, ...], list[str]]:
    """plan.jsonl's rows, then the rows of its sealed extensions (cases the fix search added;
    a damaged extension is the plan seal's problem)."""
    rows: list[PlanRow] = []
    problems: list[str] = []
    if not os.path.lexists(path):
        return (), ["plan.jsonl is missing"]
    try:
        lines = list(read_plan_lines(path))
    except ArtifactError as exc:  # a symlink, FIFO or oversized plan: recorded, never read
        return (), [f"plan.jsonl is not readable: {exc.message}"]
    lines += [(0, row) for row in extensions(path.parent).rows]
    for number, row in lines:
        if isinstance(row, ArtifactError):
            problems.append(f"plan.jsonl line {number} does not parse: {row.message}")
            continue
        case_id = row.get("case_id") if isinstance(row, dict) else None
        if not isinstance(case_id, str) or not is_safe_id(case_id):
            problems.append(f"plan.jsonl line {number} has no valid case_id")
            continue
        index = row.get("index")
        rows.append(
            PlanRow(
                case_id=case_id,
                index=index if isinstance(index, int) else len(rows),
                kind=str(row.get("kind", "one_at_a_time")),
                changed=_mapping(row.get("changed")),
                knobs=_mapping(row.get("knobs")),
                operators=_mapping(row.get("operators")),
            )
        )
    return tuple(rows), problems


def _load_case(case_dir: Path, experiment_id: str, plan_row: PlanRow | None) -> StoredCase:
    attempts: list[AttemptRecord] = []
    if case_dir.is_dir() and not case_dir.is_symlink():
        for entry in sorted(os.scandir(case_dir), key=lambda e: _attempt_order(e.name)):
            path = Path(entry.path)
            if not is_safe_id(entry.name):
                seal = SealCheck(False, ("attempt id is not a safe id",), None, None)
            elif entry.is_symlink() or not entry.is_dir(follow_symlinks=False):
                seal = SealCheck(False, ("attempt is not a real directory",), None, None)
            else:
                seal = verify_seal(path, experiment_id, case_dir.name)
            attempts.append(AttemptRecord(entry.name, path, seal))
    chosen = next((a for a in reversed(attempts) if a.seal.verified), None)
    payload = load_payload(chosen.path) if chosen is not None else None
    return StoredCase(case_dir.name, plan_row, tuple(attempts), chosen, payload)


def load_run(run_dir: str | os.PathLike[str]) -> RunRecord:
    """Read ``<output root>/<experiment_id>/`` into a :class:`RunRecord`.

    Raises :class:`ReportError` (``report.bad_run_dir``) when the directory is not a
    run directory at all; everything inside it that is merely broken is recorded.
    """
    root = Path(run_dir)
    if root.is_symlink() or not root.is_dir():
        raise ReportError("report.bad_run_dir", "not a run directory", str(root))
    header_path = root / HEADER_NAME
    if not header_path.is_file() or header_path.is_symlink():
        inside = sorted(
            p.name
            for p in root.iterdir()
            if (p / "experiment.json").is_file() and is_safe_id(p.name)
        )
        hint = f"; it holds the runs {', '.join(inside[:5])}: pass one of them" if inside else ""
        raise ReportError(
            "report.bad_run_dir", f"no experiment.json: not an xconf run directory{hint}", str(root)
        )
    try:
        header = read_json(header_path)
    except ArtifactError as exc:
        raise ReportError(
            "report.bad_header", f"experiment.json does not parse: {exc.message}", str(header_path)
        ) from None
    if not isinstance(header, dict):
        raise ReportError("report.bad_header", "experiment.json is not an object", str(header_path))
    experiment_id = str(header.get("experiment_id") or root.name)
    problems: list[str] = []
    if experiment_id != root.name:
        problems.append(
            f"experiment.json names {experiment_id!r} but the directory is {root.name!r}"
        )
    plan, plan_problems = _parse_plan(root / PLAN_NAME)
    problems.extend(plan_problems)
    seal_problem = plan_seal_problem(root)
    if seal_problem is not None:
        problems.append(f"plan seal: {seal_problem}")
    by_id = {row.case_id: row for row in plan}
    cases_dir = root / "cases"
    on_disk: list[str] = []
    if cases_dir.is_dir() and not cases_dir.is_symlink():
        for entry in sorted(os.scandir(cases_dir), key=lambda e: e.name):
            if not is_safe_id(entry.name) or entry.is_symlink() or not entry.is_dir():
                problems.append(f"cases/{entry.name} is not a valid case directory; ignored")
                continue
            on_disk.append(entry.name)
    order = [row.case_id for row in plan] + [c for c in on_disk if c not in by_id]
    for case_id in on_disk:
        if case_id not in by_id:
            problems.append(f"case {case_id} has attempts but no plan.jsonl row")
    seen: set[str] = set()
    cases: list[StoredCase] = []
    for case_id in order:
        if case_id in seen:
            problems.append(f"plan.jsonl lists case {case_id} more than once")
            continue
        seen.add(case_id)
        cases.append(_load_case(cases_dir / case_id, experiment_id, by_id.get(case_id)))
    return RunRecord(root, experiment_id, header, plan, tuple(cases), tuple(problems))
