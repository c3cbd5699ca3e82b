"""`xconf verify RUN_DIR`: recompute every seal and every verdict of a run offline.

RUN_DIR is an experiment directory ``<output root>/<experiment_id>``. For every attempt of
every case the seal is recomputed (``xconf.artifacts.seal``, the one seal checker) and the
verdict and its diagnostics are re-judged from the stored token-level tensors and the stored
threshold alone (``xconf.verify_verdict``). Only bounded JSON and safetensors are ever read:
no pickle, no link, no FIFO, nothing over its size bound.

A case's answer is its newest valid attempt with a verdict (a result a resume keeps, i.e.
not ``error``). Attempts older than that answer are history:

* a partial one (no ``COMPLETE``) is ``abandoned`` (an interrupted run that a later
  attempt replaced), a damaged one is ``superseded`` (a resume rescored it); both are shown
  with their reason and do not change the exit code.

Exit codes (checked in this order):

* ``1`` damage that is the case's current state: a damaged attempt not superseded by a
  later valid one, an entry of the experiment tree that is not part of the format, a case
  that is not in plan.jsonl, or a verdict/diagnostic that disagrees with the recomputation;
* ``3`` nothing current is damaged but the run is incomplete: a partial attempt newer
  than every verdict (or in a case without one), a planned case with no sealed attempt, or
  a case whose only valid attempts are ``error`` (no verdict: resuming runs it again);
* ``0`` every case has a valid verdict; superseded and abandoned attempts, and plan.jsonl
  lines that do not parse (``skipped``: a torn append, or a hostile line), are noted;
* ``2`` RUN_DIR is not an experiment directory (coded error ``verify.bad_run_dir``).
"""

from __future__ import annotations

import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rich.console import Console
from rich.table import Table
from rich.text import Text

from xconf.artifacts.layout import (
    CASES_DIR,
    HEADER_NAME,
    NON_REUSABLE_RESULTS,
    PLAN_NAME,
    attempt_number,
    is_stale_temp,
    judged_run,
    read_json,
    read_plan_lines,
)
from xconf.artifacts.plan_seal import extensions, plan_seal_problem, sealed_rows
from xconf.artifacts.seal import Partial, sealed_result
from xconf.artifacts.store import AttemptCheck, ExperimentStore
from xconf.errors import ArtifactError
from xconf.experiment import is_safe_id
from xconf.judge import records as judged_records
from xconf.runtime.rederive import record_problems
from xconf.verify_plan import identity_digest, identity_split, plan_row_problems
from xconf.verify_verdict import check_verdict

__all__ = ["check_verdict", "main_verify", "open_run_dir", "verify_run"]

EXIT_VALID, EXIT_DAMAGED, EXIT_BAD_RUN_DIR, EXIT_INCOMPLETE = 0, 1, 2, 3
Status = Literal[
    "valid", "partial", "abandoned", "damaged", "superseded", "missing", "no_verdict", "skipped"
]
DAMAGE: frozenset[Status] = frozenset({"damaged"})
INCOMPLETE: frozenset[Status] = frozenset({"partial", "missing", "no_verdict"})


@dataclass(frozen=True)
class Finding:
    case_id: str
    attempt_id: str
    status: Status
    result: str | None
    reason: str | None


@dataclass
class VerifyReport:
    run_dir: Path
    findings: list[Finding]

    def count(self, status: Status) -> int:
        return sum(1 for f in self.findings if f.status == status)

    @property
    def exit_code(self) -> int:
        statuses = {f.status for f in self.findings}
        if statuses & DAMAGE:
            return EXIT_DAMAGED
        if statuses & INCOMPLETE:
            return EXIT_INCOMPLETE
        return EXIT_VALID


def _bad_run_dir(run_dir: Path, why: str) -> ArtifactError:
    return ArtifactError("verify.bad_run_dir", f"{run_dir} {why}", str(run_dir))


def open_run_dir(run_dir: Path) -> ExperimentStore:
    """The store of RUN_DIR; raises ``verify.bad_run_dir`` when it is not an experiment dir."""
    run_dir = Path(run_dir).absolute()
    try:
        mode = run_dir.lstat().st_mode
    except OSError:
        raise _bad_run_dir(run_dir, "does not exist") from None
    if not stat.S_ISDIR(mode):
        raise _bad_run_dir(run_dir, "is not a real directory (symlinks are not followed)")
    try:
        header = read_json(run_dir / HEADER_NAME)
    except ArtifactError as exc:
        raise _bad_run_dir(
            run_dir,
            f"has no readable experiment.json ({exc.message}): pass <output root>/<experiment_id>",
        ) from None
    experiment_id = header.get("experiment_id") if isinstance(header, dict) else None
    if not isinstance(experiment_id, str) or experiment_id != run_dir.name:
        raise _bad_run_dir(run_dir, f"holds experiment {experiment_id!r}, not {run_dir.name!r}")
    return ExperimentStore(run_dir.parent, experiment_id)


@dataclass(frozen=True)
class _Judged:
    check: AttemptCheck
    result: str | None
    reason: str | None  # None: sealed and its verdict recomputes

    @property
    def number(self) -> int:
        return attempt_number(self.check.attempt_id) or 0

    @property
    def has_verdict(self) -> bool:
        return self.reason is None and self.result not in NON_REUSABLE_RESULTS


@dataclass(frozen=True)
class _Run:
    """What every attempt of the run is checked against: the sealed plan rows and header."""

    rows: dict[str, dict[str, Any]]
    header: dict[str, Any]

    @property
    def judged(self) -> bool:
        """The run's kind decides every attempt's (never the attempt's own records)."""
        return judged_run(self.header)


def _judge(store: ExperimentStore, entry: Path, run: _Run) -> _Judged:
    check = store.verify_attempt(entry)
    result = sealed_result(check.state)
    if check.partial:
        return _Judged(check, None, check.reason)
    reason = check.reason or check_verdict(entry, check.seal or {}, judged=run.judged)
    if reason is None and result not in NON_REUSABLE_RESULTS:
        # A verdict's records re-derived offline (an error is no verdict, never reused): the
        # execution key from the stored records, the identity's inner digest, strict
        # execution re-applied, token fields vs the identity; then the records against the
        # case's plan row and the header. A judged dump's by its own rules.
        row = run.rows.get(entry.parent.name)
        if run.judged:
            problems = judged_records.attempt_problems(entry, check.seal or {}, run.header, row)
        else:
            problems = record_problems(entry, check.seal or {})
            if not problems:
                problems = plan_row_problems(entry, row, run.header)
        reason = "; ".join(problems) if problems else None
    return _Judged(check, result, reason)


def _verify_case(
    store: ExperimentStore,
    case_dir: Path,
    planned: set[str],
    run: _Run,
    digests: dict[str, str],
    dumps: dict[str, set[str]],
) -> list[Finding]:
    case_id = case_dir.name
    findings: list[Finding] = []
    if case_id not in planned:
        findings.append(Finding(case_id, "-", "damaged", None, "case is not in plan.jsonl"))
    judged: list[_Judged] = []
    for entry in sorted(case_dir.iterdir()):
        if is_stale_temp(entry.name):
            continue  # staging file of an interrupted publication: never part of an attempt
        if attempt_number(entry.name) is None:
            findings.append(
                Finding(case_id, entry.name, "damaged", None, "unexpected entry in case dir")
            )
            continue
        judged.append(_judge(store, entry, run))
    judged.sort(key=lambda j: j.number)
    answer = max((j.number for j in judged if j.has_verdict), default=None)
    if run.judged:  # each judged dump is its own identity, bound to its case by the header
        for j in judged:
            sha = judged_records.attempt_dump(j.check.path) if j.has_verdict else None
            if sha is not None:
                dumps.setdefault(case_id, set()).add(sha)
    digest = None if answer is None else identity_digest(case_dir / f"a-{answer:04d}")
    if digest is not None and not run.judged:
        digests[f"{case_id}/a-{answer:04d}"] = digest
    for j in judged:
        attempt_id = j.check.attempt_id
        later = answer is not None and j.number < answer
        if j.reason is None:
            findings.append(Finding(case_id, attempt_id, "valid", j.result, None))
        elif isinstance(j.check.state, Partial):
            status: Status = "abandoned" if later else "partial"
            note = f"; superseded by a-{answer:04d}" if later else ""
            findings.append(Finding(case_id, attempt_id, status, None, f"{j.reason}{note}"))
        else:
            status = "superseded" if later else "damaged"
            note = f"; superseded by valid a-{answer:04d}" if later else ""
            findings.append(Finding(case_id, attempt_id, status, j.result, f"{j.reason}{note}"))
    if answer is None and judged and all(j.reason is None for j in judged):
        results = sorted({str(j.result) for j in judged})
        findings.append(
            Finding(
                case_id,
                "-",
                "no_verdict",
                None,
                f"no attempt has a verdict (only {', '.join(results)}): resume runs it again",
            )
        )
    return findings


def _planned(store: ExperimentStore, add: Callable[[Finding], None]) -> set[str]:
    """Case ids of plan.jsonl. A line that does not parse (a torn append, or a hostile one)
    is noted as ``skipped`` with its code; a plan that is not a bounded regular file is
    damage."""
    planned: set[str] = set()
    try:
        for number, row in read_plan_lines(store.path / PLAN_NAME):
            if isinstance(row, ArtifactError):
                reason = f"plan.jsonl line {number} skipped: [{row.code}] {row.message}"
                add(Finding("-", "-", "skipped", None, reason))
            elif isinstance(row, dict) and isinstance(row.get("case_id"), str):
                planned.add(row["case_id"])
    except ArtifactError as exc:
        add(Finding("-", "-", "damaged", None, f"plan.jsonl: [{exc.code}] {exc.message}"))
    # Cases a later step added (the fix search); a damaged extension is the plan seal's finding.
    planned.update(str(r["case_id"]) for r in extensions(store.path).rows if "case_id" in r)
    return planned


def verify_run(run_dir: Path) -> VerifyReport:
    store = open_run_dir(run_dir)
    report = VerifyReport(store.path, [])
    add = report.findings.append
    cases_dir = store.path / CASES_DIR
    planned = _planned(store, add)
    seen: set[str] = set()
    plan_problem = plan_seal_problem(store.path)
    if plan_problem is not None:  # a swapped or edited row would relabel verdicts
        add(Finding("-", "-", "damaged", None, f"plan seal: {plan_problem}"))
        run = _Run({}, {})
    else:
        header = read_json(store.path / HEADER_NAME)
        run = _Run(sealed_rows(store.path), header if isinstance(header, dict) else {})
    digests: dict[str, str] = {}
    dumps: dict[str, set[str]] = {}
    if cases_dir.is_symlink() or (cases_dir.exists() and not cases_dir.is_dir()):
        add(Finding("-", "-", "damaged", None, "cases is not a real directory"))
        return report
    for case_dir in sorted(cases_dir.iterdir()) if cases_dir.is_dir() else []:
        case_id = case_dir.name
        if not is_safe_id(case_id) or case_dir.is_symlink() or not case_dir.is_dir():
            add(Finding(case_id, "-", "damaged", None, "case entry is not a real directory"))
            continue
        found = _verify_case(store, case_dir, planned, run, digests, dumps)
        report.findings.extend(found)
        if any(f.status == "valid" for f in found):
            seen.add(case_id)
    for case_id in sorted(planned - seen):
        add(Finding(case_id, "-", "missing", None, "planned case has no sealed attempt"))
    split = identity_split(digests)
    if split is not None:  # what a resume refuses as artifacts.experiment_conflict
        add(Finding("-", "-", "damaged", None, split))
    binding = judged_records.binding_problem(run.header, planned, dumps) if run.judged else None
    if binding is not None:
        add(Finding("-", "-", "damaged", None, binding))
    return report


STYLE: dict[Status, str] = {
    "valid": "green",
    "partial": "yellow",
    "missing": "yellow",
    "no_verdict": "yellow",
    "abandoned": "dim",
    "superseded": "dim",
    "skipped": "dim",
    "damaged": "bold red",
}


def report_table(report: VerifyReport) -> Table:
    """The findings as a table; every cell is plain text (names and reasons come from disk)."""
    counts = ", ".join(
        f"{report.count(s)} {s}"
        for s in STYLE
        if s in ("valid", "partial", "missing", "damaged") or report.count(s)
    )
    table = Table(title=Text(f"verify {report.run_dir}: {counts}"))
    for column in ("case", "attempt", "status", "result", "reason"):
        table.add_column(column)
    for f in report.findings:
        table.add_row(
            Text(f.case_id),
            Text(f.attempt_id),
            Text(f.status, style=STYLE[f.status]),
            Text(f.result or "-"),
            Text(f.reason or ""),
        )
    return table


def main_verify(run_dir: Path, console: Console) -> int:
    """Print the verification table; exit 0 valid, 1 damaged, 2 bad RUN_DIR, 3 incomplete."""
    report = verify_run(run_dir)
    console.print(report_table(report))
    code = report.exit_code
    summary = {
        EXIT_VALID: "every case has a valid, consistent verdict",
        EXIT_DAMAGED: "damaged or inconsistent attempts found: do not trust them",
        EXIT_INCOMPLETE: "no damage, but the run is incomplete: resume it",
    }[code]
    notes = report.count("abandoned") + report.count("superseded")
    if code == EXIT_VALID and notes:
        summary += f" ({notes} older abandoned or superseded attempt(s) noted)"
    console.print(Text(f"xconf verify: {summary} (exit {code})"))
    return code
