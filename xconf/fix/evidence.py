"""What one fix case showed, read from its sealed attempt (never from the runner's memory).

A case is a *verified fix* only when its own sealed attempt passed the contract's threshold
and every knob the step set was applied and read back from the live engine as requested
(``actual.json``); a case that errored, whose knob fell back or did not read back, or whose
other knobs were confounded, is never a fix. Beside the verdict: how many active tokens are
bitwise equal on the two sides, and the step's effect on the failing case's drift with the
confidence interval the knob attribution computes (``report/attribution.effect``: mean
|diff| over active tokens, paired bootstrap over sequences). Diagnostics never vote.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from xconf.artifacts.store import ExperimentStore
from xconf.case_record import CaseRecord
from xconf.report.attribution import describe, effect, sequence_sums
from xconf.report.loader import AttemptPayload, load_payload
from xconf.report.model import Effect
from xconf.verify_verdict import check_verdict


@dataclass(frozen=True)
class StepEvidence:
    result: str
    active: int
    mismatches: int
    bitwise: int
    max_abs_diff: float | None
    effect: Effect | None
    not_read_back: tuple[str, ...]  # the step's knobs not applied and read back as set
    reason: str | None

    @property
    def verified(self) -> bool:
        return self.result == "pass" and not self.not_read_back and self.active > 0

    @property
    def effect_text(self) -> str:
        return describe(self.effect)


def attempt_path(run_dir: Path, record: CaseRecord) -> Path:
    return run_dir / "cases" / record.case_id / record.attempt_id


def bitwise_equal(payload: AttemptPayload | None) -> int:
    """Active tokens whose two logprobs are the same bits."""
    diffs = None if payload is None else payload.token_diffs
    if diffs is None or diffs.rollout_logprobs.shape != diffs.training_logprobs.shape:
        return 0
    same = diffs.rollout_logprobs.tobytes() == diffs.training_logprobs.tobytes()
    if same:
        return int(diffs.active_mask.astype(bool).sum())
    rollout = np.ascontiguousarray(diffs.rollout_logprobs)
    training = np.ascontiguousarray(diffs.training_logprobs)
    width = {4: np.int32, 8: np.int64, 2: np.int16}.get(rollout.dtype.itemsize)
    if width is None or rollout.dtype != training.dtype:
        return 0
    equal = rollout.view(width) == training.view(width)
    return int((equal & diffs.active_mask.astype(bool)).sum())


def not_read_back(payload: AttemptPayload | None, paths: Sequence[str]) -> tuple[str, ...]:
    """The knobs of ``paths`` that ``actual.json`` does not show applied with their requested
    value on some side that declares them (or on no side at all)."""
    sides = (payload.actual if payload is not None else {}).get("sides")
    rows: list[Any] = []
    if isinstance(sides, dict):
        for entries in sides.values():
            rows.extend(e for e in entries or () if isinstance(e, dict))
    missing = []
    for path in paths:
        mine = [r for r in rows if r.get("path") == path]
        good = mine and all(
            r.get("status") == "applied" and r.get("actual") == r.get("requested") for r in mine
        )
        if not good:
            missing.append(path)
    return tuple(missing)


def sealed_problem(store: ExperimentStore, path: Path) -> str | None:
    """Why the attempt at ``path`` cannot speak for its case: its seal does not verify, or
    its verdict does not re-judge from its own tensors (None: it speaks)."""
    check = store.verify_attempt(path)
    if not check.valid or check.seal is None:
        return check.reason or "the attempt is not sealed"
    return check_verdict(path, check.seal)


def step_evidence(
    store: ExperimentStore, record: CaseRecord, source: AttemptPayload | None, paths: Sequence[str]
) -> StepEvidence:
    path = attempt_path(store.path, record)
    payload = load_payload(path)
    unread = not_read_back(payload, paths)
    if record.result == "error":
        unread = unread or tuple(paths)
    problem = sealed_problem(store, path)
    source_sums = sequence_sums(source.token_diffs if source is not None else None)
    case_sums = sequence_sums(payload.token_diffs if payload is not None else None)
    comparison = payload.comparison if payload is not None else {}
    sealed = str(comparison.get("result", record.result))
    return StepEvidence(
        # The runner's verdict and the sealed one must agree, and the seal must verify.
        result=sealed if problem is None and sealed == record.result else "error",
        active=int(comparison.get("active_tokens") or 0),
        mismatches=int(comparison.get("mismatches") or 0),
        bitwise=bitwise_equal(payload),
        max_abs_diff=record.max_abs_diff,
        effect=effect(source_sums, case_sums),
        not_read_back=unread,
        reason=record.reason if problem is None else f"sealed attempt: {problem}",
    )
