"""`xconf verify RUN_DIR`: recompute every seal and every verdict of a run offline.

RUN_DIR is an experiment directory ``<output root>/<experiment_id>``. For every attempt of
every case the seal is recomputed (`ExperimentStore.verify_attempt`) and the verdict is
re-judged from the stored token-level tensors and the stored threshold alone
(`comparison.recompute_result`), then compared with ``comparison.json`` and with the result
``COMPLETE`` names. Only JSON and safetensors are ever read: no pickle is ever loaded.

Exit codes:

* ``0`` every attempt is sealed, valid and consistent, and every planned case has one;
* ``1`` at least one attempt (or entry of the experiment tree) is damaged or its verdict
  disagrees with the recomputation: the run cannot be trusted as it is;
* ``2`` RUN_DIR is not an experiment directory (coded error ``verify.bad_run_dir``);
* ``3`` nothing is damaged, but the run is incomplete: partial attempts (no ``COMPLETE``,
  left by an interrupted run and never reused) or planned cases without a sealed attempt.
  Resuming the run completes it; partial attempts are reported, not counted as damage.
"""

from __future__ import annotations

import json
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from rich.console import Console
from rich.table import Table

from xconf.artifacts.plan_seal import plan_seal_problem
from xconf.artifacts.store import ExperimentStore, read_tensors
from xconf.comparison import recompute_result, verdict_threshold
from xconf.contract.loader import load_contract
from xconf.errors import ArtifactError, XconfError
from xconf.schema import is_safe_id

EXIT_VALID, EXIT_DAMAGED, EXIT_BAD_RUN_DIR, EXIT_INCOMPLETE = 0, 1, 2, 3
Status = Literal["valid", "partial", "damaged", "missing"]
PARTIAL_REASON = "no COMPLETE seal (partial attempt)"
STALE_TEMP = re.compile(r"^\.a-\d+\.[A-Za-z0-9._-]+\.tmp-[0-9a-f]{12}$")
ATTEMPT = re.compile(r"^a-\d+$")
RECOMPUTABLE = frozenset({"pass", "fail", "zero_active_tokens"})
JSON_FILES = ("requested.json", "materialized.json", "actual.json", "identity.json")
SCORE_FILES = {"rollout": "score_rollout.safetensors", "training": "score_training.safetensors"}


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
        if self.count("damaged"):
            return EXIT_DAMAGED
        if self.count("partial") or self.count("missing"):
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
    header = run_dir / "experiment.json"
    try:
        if not stat.S_ISREG(header.lstat().st_mode):
            raise _bad_run_dir(run_dir, "has an experiment.json that is not a regular file")
        experiment_id = json.loads(header.read_text("utf-8"))["experiment_id"]
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise _bad_run_dir(
            run_dir, "has no readable experiment.json: pass <output root>/<experiment_id>"
        ) from None
    if not isinstance(experiment_id, str) or experiment_id != run_dir.name:
        raise _bad_run_dir(run_dir, f"holds experiment {experiment_id!r}, not {run_dir.name!r}")
    return ExperimentStore(run_dir.parent, experiment_id)


def _planned(store: ExperimentStore) -> set[str]:
    try:
        return store.planned_case_ids()
    except (OSError, UnicodeDecodeError, XconfError):
        return set()


def _equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a, b))


def check_verdict(path: Path, seal: Mapping[str, Any]) -> str | None:
    """Re-judge a sealed attempt from its own tensors; the first disagreement, or None."""
    for name in JSON_FILES:
        try:
            document = json.loads((path / name).read_text("utf-8"))
        except (OSError, ValueError, UnicodeDecodeError):
            return f"{name} is not valid JSON"
        if not isinstance(document, dict):
            return f"{name} is not a JSON object"
        if name == "requested.json" and document.get("case_id") != seal.get("case_id"):
            return "requested.json names another case"
    try:
        doc = json.loads((path / "comparison.json").read_text("utf-8"))
        diffs = read_tensors(path / "token_diffs.safetensors")
        scores = {side: read_tensors(path / name) for side, name in SCORE_FILES.items()}
    except Exception as exc:  # any unreadable payload is damage, whatever the parser raised
        return f"unreadable payload: {type(exc).__name__}: {exc}"
    if not isinstance(doc, dict):
        return "comparison.json is not an object"
    result = doc.get("result")
    if result != seal.get("result"):
        return f"comparison.json says {result!r}, COMPLETE says {seal.get('result')!r}"
    if doc.get("case_id") != seal.get("case_id"):
        return "comparison.json names another case"
    if not diffs:
        if result in RECOMPUTABLE:
            return f"result {result!r} but no token-level tensors to recompute it from"
        return None  # error / invalid_identity / invalid_artifact: nothing was compared
    if result not in RECOMPUTABLE:
        return f"result {result!r} but token-level tensors are present"
    try:
        recomputed, mismatches = recompute_result(diffs)
        active = diffs["active_mask"].bool()
        threshold = float(diffs["threshold"])
        mask = (
            active & (torch.abs(diffs["training_logprobs"] - diffs["rollout_logprobs"]) > threshold)
        ).to(torch.uint8)
        stored_mask = diffs["mismatch_mask"]
    except Exception as exc:
        return f"token_diffs.safetensors is malformed: {type(exc).__name__}: {exc}"
    if recomputed != result:
        return f"recomputed verdict {recomputed!r} disagrees with stored {result!r}"
    if mismatches != doc.get("mismatches"):
        return f"recomputed {mismatches} mismatches, comparison.json says {doc.get('mismatches')}"
    if int(active.sum()) != doc.get("active_tokens", 0) and recomputed != "zero_active_tokens":
        return "active token count disagrees with comparison.json"
    if not _equal(mask, stored_mask):
        return "stored mismatch_mask disagrees with the recomputation"
    stored_threshold = doc.get("threshold")
    if not isinstance(stored_threshold, float) or verdict_threshold(stored_threshold) != threshold:
        return f"threshold {threshold!r} in tensors, {stored_threshold!r} in comparison.json"
    contract = load_contract()
    if (doc.get("contract") or {}).get("sha256") == contract.identity().get("sha256"):
        try:
            expected = contract.threshold_for(
                str(doc.get("rollout_dtype")), str(doc.get("training_dtype"))
            ).value
        except XconfError:
            return "comparison.json names dtypes the contract has no threshold for"
        if verdict_threshold(expected) != threshold:
            return f"threshold {threshold!r} is not the contract's {expected!r}"
    for side, score in scores.items():
        try:
            logprobs = score["logprobs"].float()
        except KeyError:
            return f"{SCORE_FILES[side]} has no logprobs"
        stored = diffs[f"{side}_logprobs"]
        if logprobs.shape != active.shape or not _equal(
            torch.where(active, logprobs, torch.zeros_like(logprobs)), stored
        ):
            return f"{SCORE_FILES[side]} disagrees with token_diffs.safetensors"
    return None


def verify_run(run_dir: Path) -> VerifyReport:
    store = open_run_dir(run_dir)
    report = VerifyReport(store.path, [])
    add = report.findings.append
    cases_dir = store.path / "cases"
    planned = _planned(store)
    seen: set[str] = set()
    plan_problem = plan_seal_problem(store.path)
    if plan_problem is not None:  # a swapped or edited row would relabel verdicts
        add(Finding("-", "-", "damaged", None, f"plan seal: {plan_problem}"))
    if cases_dir.is_symlink() or (cases_dir.exists() and not cases_dir.is_dir()):
        add(Finding("-", "-", "damaged", None, "cases is not a real directory"))
        return report
    case_dirs = sorted(cases_dir.iterdir()) if cases_dir.is_dir() else []
    for case_dir in case_dirs:
        case_id = case_dir.name
        if not is_safe_id(case_id) or case_dir.is_symlink() or not case_dir.is_dir():
            add(Finding(case_id, "-", "damaged", None, "case entry is not a real directory"))
            continue
        if case_id not in planned:
            add(Finding(case_id, "-", "damaged", None, "case is not in plan.jsonl"))
        has_valid = False
        for entry in sorted(case_dir.iterdir()):
            if STALE_TEMP.match(entry.name):
                continue  # staging file of an interrupted publication: never part of an attempt
            if not ATTEMPT.match(entry.name):
                add(Finding(case_id, entry.name, "damaged", None, "unexpected entry in case dir"))
                continue
            check = store.verify_attempt(entry)
            if check.reason == PARTIAL_REASON:
                add(Finding(case_id, entry.name, "partial", None, check.reason))
                continue
            seal = check.seal or {}
            result = seal.get("result") if isinstance(seal.get("result"), str) else None
            reason = check.reason or check_verdict(entry, seal)
            if reason is not None:
                add(Finding(case_id, entry.name, "damaged", result, reason))
                continue
            has_valid = True
            add(Finding(case_id, entry.name, "valid", result, None))
        if has_valid:
            seen.add(case_id)
    for case_id in sorted(planned - seen):
        add(Finding(case_id, "-", "missing", None, "planned case has no sealed attempt"))
    return report


STYLE = {"valid": "green", "partial": "yellow", "missing": "yellow", "damaged": "bold red"}


def report_table(report: VerifyReport) -> Table:
    table = Table(
        title=f"verify {report.run_dir}: {report.count('valid')} valid, "
        f"{report.count('partial')} partial, {report.count('missing')} missing, "
        f"{report.count('damaged')} damaged"
    )
    for column in ("case", "attempt", "status", "result", "reason"):
        table.add_column(column)
    for f in report.findings:
        style = STYLE[f.status]
        table.add_row(
            f.case_id, f.attempt_id, f"[{style}]{f.status}[/]", f.result or "-", f.reason or ""
        )
    return table


def main_verify(run_dir: Path, console: Console) -> int:
    """Print the verification table; exit 0 valid, 1 damaged, 2 bad RUN_DIR, 3 incomplete."""
    report = verify_run(run_dir)
    console.print(report_table(report))
    code = report.exit_code
    summary = {
        EXIT_VALID: "every attempt is sealed, valid and consistent",
        EXIT_DAMAGED: "damaged or inconsistent attempts found: do not trust them",
        EXIT_INCOMPLETE: "no damage, but the run is incomplete: resume it",
    }[code]
    console.print(f"xconf verify: {summary} (exit {code})")
    return code
