"""Immutable records of a drift report (``xconf.report.v1``) and their JSON form."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

REPORT_SCHEMA = "xconf.report.v1"

# Verdict-table order after the baseline: failures first, passes last.
SEVERITY = {
    "fail": 0,
    "invalid_identity": 1,
    "invalid_artifact": 2,
    "error": 3,
    "zero_active_tokens": 4,
    "not_run": 5,
    "pass": 6,
}
RESULTS = tuple(SEVERITY)


@dataclass(frozen=True)
class DiffStats:
    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None
    max: float | None


@dataclass(frozen=True)
class Histogram:
    """|diff| of the active tokens in logarithmic bins; exact zeros counted apart."""

    edges: tuple[float, ...]
    counts: tuple[int, ...]
    zero_count: int
    threshold_line: float
    above_threshold: int


@dataclass(frozen=True)
class ProfilePoint:
    position: int
    active: int
    mean_abs_diff: float | None
    max_abs_diff: float | None


@dataclass(frozen=True)
class WorstToken:
    batch: int
    position: int
    token_id: int | None
    text: str | None
    rollout_logprob: float | None
    training_logprob: float | None
    abs_diff: float | None
    mismatch: bool


@dataclass(frozen=True)
class SequenceText:
    """One sequence as text: the prompt, then each response token with its |diff|."""

    batch: int
    prompt: str
    tokens: tuple[tuple[str, float | None, bool], ...]  # (text, |diff|, mismatch)


@dataclass(frozen=True)
class SequenceDrift:
    """One sequence's drift: its log importance ratio and its mismatches.

    ``log_ratio`` is the sum over the row's active tokens of ``training - rollout`` (nats):
    log pi_train(response) - log pi_rollout(response), verl's sequence-level importance
    log-weight; ``mean_log_ratio`` divides it by the row's active tokens.
    """

    batch: int
    active: int
    log_ratio: float | None
    mean_log_ratio: float | None
    mismatches: int
    max_abs_diff: float | None
    text: str | None  # the response's tokens as text, when token ids and a tokenizer exist


@dataclass(frozen=True)
class KnobRow:
    """One knob on one side: requested → materialized → actual."""

    side: str
    path: str
    requested: Any
    materialized: Any
    actual: Any
    status: str | None
    evidence: str | None
    lifecycle: str | None


@dataclass(frozen=True)
class AttemptInfo:
    attempt_id: str
    seal_verified: bool
    problems: tuple[str, ...]
    sealed_result: str | None
    execution_key: str | None
    chosen: bool


@dataclass(frozen=True)
class CaseReport:
    case_id: str
    index: int
    kind: str
    changed: tuple[tuple[str, Any], ...]
    label: str
    is_baseline: bool
    result: str
    reason: str | None
    active_tokens: int | None
    mismatches: int | None
    mismatch_ratio: float | None
    diff: DiffStats
    approx_kl: float | None
    threshold: float | None
    threshold_dtype: str | None
    threshold_rule: str | None
    contract_version: str | None
    contract_sha256: str | None
    rollout_dtype: str | None
    training_dtype: str | None
    operators: Mapping[str, Any]
    attempt_id: str | None
    seal_verified: bool
    recomputed: str
    histogram: Histogram | None
    drift_profile: tuple[ProfilePoint, ...]
    worst_tokens: tuple[WorstToken, ...]
    materialization: tuple[KnobRow, ...]
    attempts: tuple[AttemptInfo, ...]
    problems: tuple[str, ...]
    wall_s: float | None = None  # seconds the case took (both engines and both sides)
    rollout_correction: Mapping[str, Any] | None = None  # verl's figures; never vote
    full_vocab: Mapping[str, Any] | None = None  # xconf/full_vocab.py's figures; never vote
    sequences: tuple[SequenceText, ...] = ()  # only with a tokenizer at hand
    # The worst sequences by |sequence log-ratio| and by mismatch count (report/sequences.py).
    worst_sequences_by_log_ratio: tuple[SequenceDrift, ...] = ()
    worst_sequences_by_mismatches: tuple[SequenceDrift, ...] = ()
    # False: a declared knob was not run as requested (no strict execution); the verdict
    # stands, but the case is no evidence about the knob and is left out of the ranking.
    intervention_applied: bool = True
    engines: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def severity(self) -> int:
        return SEVERITY.get(self.result, SEVERITY["invalid_artifact"])


@dataclass(frozen=True)
class Effect:
    """A case's drift against the baseline's on the same sequences, with a paired bootstrap
    interval over sequences (``xconf/report/attribution.py``); a diagnostic, never a vote."""

    statistic: str
    baseline: float
    case: float
    delta: float  # case - baseline
    delta_low: float | None  # None: too few sequences for an interval
    delta_high: float | None
    ratio: float | None  # case / baseline (None: the baseline's is 0)
    ratio_low: float | None
    ratio_high: float | None
    sequences: int
    resamples: int
    seed: int
    confidence: float


@dataclass(frozen=True)
class Headline:
    """What the report says first (terminal, HTML and JSON alike)."""

    baseline_fails: bool
    under_threshold: tuple[str, ...]  # cases that pass at the failing baseline's threshold
    most_drift: str | None  # a knob only when its interval tells it apart from the baseline
    most_drift_case_id: str | None
    lines: tuple[str, ...]


@dataclass(frozen=True)
class AttributionRow:
    """One intervention's drift beside the baseline's."""

    case_id: str
    knobs: tuple[str, ...]
    label: str
    kind: str
    result: str
    baseline_max_abs_diff: float | None
    max_abs_diff: float | None
    baseline_mismatch_ratio: float | None
    mismatch_ratio: float | None
    delta_mismatch_ratio: float | None
    log10_shift: float | None  # log10((max + eps) / (baseline max + eps))
    threshold: float | None = None  # this case's own contract threshold
    effect: Effect | None = None  # mean |diff| against the baseline's, with its interval
    # The case's full-vocabulary means (xconf/full_vocab.py; None: no rows on a side).
    kl_rollout_training: float | None = None
    kl_training_rollout: float | None = None
    total_variation: float | None = None
    top10_overlap: float | None = None
    argmax_agreement: float | None = None


@dataclass(frozen=True)
class KnobRank:
    """How far changing one knob (or one pair) moves drift, over its cases."""

    rank: int
    knob: str
    case_ids: tuple[str, ...]
    worst_case_id: str
    results: tuple[str, ...]
    max_abs_diff: float | None
    mismatch_ratio: float | None
    delta_mismatch_ratio: float | None
    log10_shift: float | None
    effect: Effect | None = None  # of the worst case
    label: str = ""  # the worst case's changed knobs (knob=value)


@dataclass(frozen=True)
class ContractUse:
    version: str | None
    sha256: str | None
    thresholds: tuple[tuple[str, float], ...]  # (dtype, threshold) seen in the run
    rules: tuple[str, ...]


@dataclass(frozen=True)
class ReportData:
    schema: str
    experiment_id: str
    run_dir: str
    header: Mapping[str, Any]
    baseline_case_id: str | None
    cases: tuple[CaseReport, ...]  # verdict-table order
    counts: Mapping[str, int]
    attribution: tuple[AttributionRow, ...]
    knob_ranking: tuple[KnobRank, ...]
    contracts: tuple[ContractUse, ...]
    problems: tuple[str, ...]
    headline: Headline | None = None
    # The fix searches (``xconf fix``) of the run, each checked against its cases
    # (``report/fix_section.py``).
    fixes: tuple[Mapping[str, Any], ...] = ()

    @property
    def baseline(self) -> CaseReport | None:
        return next((c for c in self.cases if c.is_baseline), None)

    @property
    def failures(self) -> tuple[CaseReport, ...]:
        return tuple(c for c in self.cases if c.result == "fail")

    def to_json_dict(self) -> dict[str, Any]:
        """Plain JSON-safe data (non-finite floats become ``None``)."""
        result = _jsonable(dataclasses.asdict(self))
        if not isinstance(result, dict):  # pragma: no cover - asdict returns a dict
            raise TypeError("report did not serialise to an object")
        return result


def _jsonable(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, str | int | bool):
        return value
    return str(value)
