"""Turn a loaded run into :class:`ReportData`: verdicts, attribution, provenance."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from xconf.report import attribution, stats
from xconf.report.fix_section import fix_sections
from xconf.report.loader import RunRecord, StoredCase, load_run
from xconf.report.model import (
    REPORT_SCHEMA,
    RESULTS,
    AttemptInfo,
    CaseReport,
    ContractUse,
    DiffStats,
    KnobRow,
    ReportData,
)
from xconf.report.sequences import sequences, worst_sequences
from xconf.report.tokens import DecoderFactory, default_decoder_factory

NUMERIC_RESULTS = ("pass", "fail")  # results whose diagnostics are numbers
HEADER_FIELDS = ("experiment_id", "scenario_id", "strategy", "contract_version", "scenario")


def build_report(
    run_dir: str | os.PathLike[str],
    *,
    decoder_factory: DecoderFactory | None = None,
    tokenizer: os.PathLike[str] | str | None = None,
) -> ReportData:
    """Read ``run_dir`` and assemble everything the report shows.

    ``decoder_factory`` maps an identity record to a token decoder (or ``None``); by
    default a tokenizer is used only when the identity names one that loads locally.
    """
    run = load_run(run_dir)
    factory = decoder_factory or default_decoder_factory(
        run.run_dir, Path(tokenizer) if tokenizer is not None else None
    )
    cases = [_case_report(case, factory) for case in run.cases]
    baseline_id = _baseline_id(run, cases)
    cases = [_with_baseline_flag(c, c.case_id == baseline_id) for c in cases]
    ordered = sorted(cases, key=_verdict_key)
    baseline = next((c for c in ordered if c.is_baseline), None)
    # Per-sequence sums of the cases whose numbers stand (a verdict of pass or fail).
    numeric = {c.case_id for c in ordered if c.result in NUMERIC_RESULTS}
    sums = {
        case.case_id: attribution.sequence_sums(case.payload.token_diffs)
        for case in run.cases
        if case.payload is not None and case.case_id in numeric
    }
    base_sums = sums.get(baseline.case_id) if baseline is not None else None
    rows = tuple(
        attribution.attribution_row(c, baseline, attribution.effect(base_sums, sums.get(c.case_id)))
        for c in ordered
        if not c.is_baseline and c.intervention_applied  # an unapplied knob proves nothing
    )
    ranking = attribution.rank_knobs(rows)
    counts = {result: 0 for result in RESULTS}
    for case in ordered:
        counts[case.result] = counts.get(case.result, 0) + 1
    return ReportData(
        schema=REPORT_SCHEMA,
        experiment_id=run.experiment_id,
        run_dir=str(run.run_dir),
        header={k: run.header[k] for k in HEADER_FIELDS if k in run.header},
        baseline_case_id=baseline_id,
        cases=tuple(ordered),
        counts=counts,
        attribution=rows,
        knob_ranking=ranking,
        contracts=_contracts(ordered),
        problems=run.problems,
        headline=attribution.headline(baseline, rows, ranking),
        fixes=fix_sections(run.run_dir, ordered),
    )


def _verdict_key(case: CaseReport) -> tuple[Any, ...]:
    ratio = case.mismatch_ratio if case.mismatch_ratio is not None else -1.0
    worst = case.diff.max if case.diff.max is not None else -1.0
    ratio = -1.0 if math.isnan(ratio) else ratio
    worst = math.inf if math.isnan(worst) else worst  # a NaN diff is as bad as it gets
    return (not case.is_baseline, case.severity, -ratio, -worst, case.index, case.case_id)


def _baseline_id(run: RunRecord, cases: list[CaseReport]) -> str | None:
    for row in run.plan:
        if row.kind == "baseline":
            return row.case_id
    declared = run.header.get("baseline_case_id")
    if isinstance(declared, str) and any(c.case_id == declared for c in cases):
        return declared
    unchanged = [c for c in cases if not c.changed]
    return unchanged[0].case_id if len(unchanged) == 1 else None


def _with_baseline_flag(case: CaseReport, is_baseline: bool) -> CaseReport:
    if case.is_baseline == is_baseline:
        return case
    label = "baseline" if is_baseline else case.label
    return dataclasses.replace(case, is_baseline=is_baseline, label=label)


def _label(changed: Iterable[tuple[str, Any]]) -> str:
    parts = [f"{path}={_show(value)}" for path, value in changed]
    return ", ".join(parts) if parts else "no change recorded"


def _show(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _case_report(case: StoredCase, factory: DecoderFactory) -> CaseReport:
    row = case.plan_row
    payload = case.payload
    recorded = payload.requested.get("changed") if payload else None
    source = row.changed if row else (recorded if isinstance(recorded, dict) else {})
    changed = tuple(sorted((str(k), v) for k, v in source.items()))
    attempts = tuple(
        AttemptInfo(
            attempt_id=a.attempt_id,
            seal_verified=a.seal.verified,
            problems=a.seal.problems,
            sealed_result=a.seal.sealed_result,
            execution_key=a.seal.execution_key,
            chosen=case.chosen is not None and a.attempt_id == case.chosen.attempt_id,
        )
        for a in case.attempts
    )
    comparison: Mapping[str, Any] = payload.comparison if payload else {}
    diffs = payload.token_diffs if payload else None
    problems = list(payload.problems) if payload else []
    result, reason = _result(case, comparison, problems)
    if payload is not None:
        problems.extend(payload.tensor_problems)
        if diffs is None and result in NUMERIC_RESULTS and not payload.tensor_problems:
            problems.append("token_diffs.safetensors holds no tensors: no offline recount")
    recomputed, recompute_problems = stats.recompute(comparison, diffs)
    problems.extend(recompute_problems)
    numeric = result in NUMERIC_RESULTS
    contract = comparison.get("contract")
    contract = contract if isinstance(contract, dict) else {}
    identity = payload.identity if payload else {}
    decode: Callable[[int], str] | None = None
    if result in NUMERIC_RESULTS and diffs is not None:
        decode = factory(identity)
    by_ratio, by_mismatches = (
        worst_sequences(diffs, decode) if numeric and diffs is not None else ((), ())
    )
    return CaseReport(
        case_id=case.case_id,
        index=row.index if row else 1 << 30,
        kind=row.kind if row else "unplanned",
        changed=changed,
        label=_label(changed),
        is_baseline=False,
        result=result,
        reason=reason,
        active_tokens=stats.as_int(comparison.get("active_tokens"))
        if numeric or result == "zero_active_tokens"
        else None,
        mismatches=stats.as_int(comparison.get("mismatches")) if numeric else None,
        mismatch_ratio=stats.as_float(comparison.get("mismatch_ratio")) if numeric else None,
        diff=stats.diff_stats(comparison, diffs)
        if payload
        else DiffStats(None, None, None, None, None),
        approx_kl=stats.as_float(comparison.get("approx_kl")),
        threshold=stats.as_float(comparison.get("threshold"))
        if comparison.get("threshold") is not None
        else (diffs.threshold if diffs else None),
        threshold_dtype=_str(comparison.get("threshold_dtype")),
        threshold_rule=_str(comparison.get("threshold_rule")),
        contract_version=_str(contract.get("version")),
        contract_sha256=_str(contract.get("sha256")),
        rollout_dtype=_str(comparison.get("rollout_dtype")),
        training_dtype=_str(comparison.get("training_dtype")),
        operators=dict(row.operators) if row else {},
        attempt_id=case.chosen.attempt_id if case.chosen else None,
        seal_verified=case.chosen is not None,
        recomputed=recomputed,
        histogram=stats.histogram(diffs, stats.as_float(comparison.get("threshold")))
        if diffs is not None
        else None,
        drift_profile=stats.drift_profile(comparison, diffs),
        worst_tokens=stats.worst_tokens(diffs, decode)
        if result == "fail" and diffs is not None
        else (),
        materialization=_materialization(payload.requested, payload.materialized, payload.actual)
        if payload
        else (),
        attempts=attempts,
        problems=tuple(problems),
        wall_s=stats.as_float(payload.actual.get("wall_s")) if payload else None,
        rollout_correction=_mapping_or_none(comparison.get("rollout_correction")),
        full_vocab=_mapping_or_none(comparison.get("full_vocab")),
        sequences=sequences(identity, diffs, decode) if diffs is not None and decode else (),
        worst_sequences_by_log_ratio=by_ratio,
        worst_sequences_by_mismatches=by_mismatches,
        intervention_applied=_intervention_applied(comparison),
        engines=_engines(payload.actual if payload else {}),
    )


def _mapping_or_none(value: Any) -> Mapping[str, Any] | None:
    return value if isinstance(value, dict) else None


def _intervention_applied(comparison: Mapping[str, Any]) -> bool:
    intervention = comparison.get("intervention")
    return not (isinstance(intervention, dict) and intervention.get("applied") is False)


def _engines(actual: Any) -> dict[str, Any]:
    """Engine versions and code digest that scored the attempt (actual.json provenance)."""
    provenance = actual.get("provenance") if isinstance(actual, dict) else None
    if not isinstance(provenance, dict):
        return {}
    engines = provenance.get("engines")
    code = provenance.get("code")
    found = dict(engines) if isinstance(engines, dict) else {}
    if isinstance(code, dict) and isinstance(code.get("xconf"), str):
        found["xconf"] = code["xconf"]
    return found


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _result(
    case: StoredCase, comparison: Mapping[str, Any], problems: list[str]
) -> tuple[str, str | None]:
    if not case.attempts:
        return "not_run", "no attempt on disk"
    if case.chosen is None:
        newest = case.attempts[-1]
        detail = "; ".join(newest.seal.problems[:3])
        return "invalid_artifact", f"no attempt has a verified seal ({newest.attempt_id}: {detail})"
    if problems:
        return "invalid_artifact", "; ".join(problems[:3])
    result = comparison.get("result")
    if result not in RESULTS or result == "not_run":
        return "invalid_artifact", f"comparison.json has unknown result {result!r}"
    if comparison.get("case_id") not in (None, case.case_id):
        return "invalid_artifact", "comparison.json names another case"
    # COMPLETE's result agreeing with comparison.json is part of the seal check (chosen).
    reason = comparison.get("reason")
    error = comparison.get("error")
    if isinstance(error, dict):
        code, message = error.get("code"), error.get("message")
        reason = f"[{code}] {message}" + (f" at {error['path']}" if error.get("path") else "")
    return str(result), reason if isinstance(reason, str) else None


def _applications(document: Mapping[str, Any]) -> dict[tuple[str, str], Mapping[str, Any]]:
    """KnobApplications by (side, path) from ``{"sides": {side: ...}}``.

    A side is a list of KnobApplication records (``actual.json``), a SideBinding record
    holding them under ``knobs`` (``materialized.json``), or a ``{path: record}`` map.
    """
    sides = document.get("sides")
    out: dict[tuple[str, str], Mapping[str, Any]] = {}
    if not isinstance(sides, dict):
        return out
    for side, apps in sides.items():
        items: Iterable[tuple[str | None, Any]]
        if isinstance(apps, dict) and isinstance(apps.get("knobs"), list):
            items = ((None, a) for a in apps["knobs"])  # a SideBinding record
        elif isinstance(apps, dict):
            items = apps.items()
        elif isinstance(apps, list):
            items = ((None, a) for a in apps)
        else:
            continue
        for path, app in items:
            if not isinstance(app, dict):
                continue
            name = path or app.get("path") or app.get("knob") or app.get("name")
            if isinstance(name, str):
                out[(str(side), name)] = app
    return out


def _pick(app: Mapping[str, Any] | None, *keys: str) -> Any:
    if not app:
        return None
    for key in keys:
        if key in app:
            return app[key]
    return None


def _evidence(app: Mapping[str, Any] | None) -> str | None:
    value = _pick(app, "evidence")
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(", ", ": "))


def _materialization(
    requested: Mapping[str, Any], materialized: Mapping[str, Any], actual: Mapping[str, Any]
) -> tuple[KnobRow, ...]:
    knobs = requested.get("knobs")
    knobs = knobs if isinstance(knobs, dict) else {}
    mat = _applications(materialized)
    act = _applications(actual)
    rows = []
    for side, path in sorted(set(mat) | set(act)):
        m, a = mat.get((side, path)), act.get((side, path))
        req = _pick(a, "requested") if a and "requested" in a else _pick(m, "requested")
        if req is None:
            req = knobs.get(path)
        status = _pick(a, "status") or _pick(m, "status")
        lifecycle = _pick(a, "lifecycle") or _pick(m, "lifecycle")
        rows.append(
            KnobRow(
                side=side,
                path=path,
                requested=req,
                materialized=_pick(m, "materialized", "value"),
                actual=_pick(a, "actual", "value", "materialized"),
                status=str(status) if status is not None else None,
                evidence=_evidence(a) or _evidence(m),
                lifecycle=str(lifecycle) if lifecycle is not None else None,
            )
        )
    return tuple(rows)


def _contracts(cases: Iterable[CaseReport]) -> tuple[ContractUse, ...]:
    seen: dict[tuple[str | None, str | None], tuple[set[tuple[str, float]], set[str]]] = {}
    for case in cases:
        if case.contract_version is None and case.contract_sha256 is None:
            continue
        thresholds, rules = seen.setdefault(
            (case.contract_version, case.contract_sha256), (set(), set())
        )
        if case.threshold is not None:
            thresholds.add((case.threshold_dtype or "?", case.threshold))
        if case.threshold_rule:
            rules.add(case.threshold_rule)
    return tuple(
        ContractUse(version, sha, tuple(sorted(thresholds)), tuple(sorted(rules)))
        for (version, sha), (thresholds, rules) in sorted(seen.items(), key=lambda kv: str(kv[0]))
    )
