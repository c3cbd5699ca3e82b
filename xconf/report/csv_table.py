"""``xconf report --format csv``: one row per case, for spreadsheets and experiment trackers."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

from xconf.report.model import CaseReport, ReportData
from xconf.rollout_correction import METRICS

COLUMNS = (
    "experiment_id",
    "case_id",
    "label",
    "is_baseline",
    "result",
    "reason",
    "active_tokens",
    "mismatches",
    "mismatch_ratio",
    "diff_mean",
    "diff_p50",
    "diff_p90",
    "diff_p99",
    "diff_max",
    "approx_kl",
    "threshold",
    "threshold_dtype",
    "rollout_dtype",
    "training_dtype",
    "changed",
    "wall_s",
    "attempt_id",
    "seal_verified",
    *(f"rc_{name}" for name in METRICS),
)


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)  # shortest round-trip form: no precision lost in the sheet
    return value


def _row(experiment_id: str, c: CaseReport) -> dict[str, Any]:
    rc = (c.rollout_correction or {}).get("metrics") or {}
    row = {
        "experiment_id": experiment_id,
        "case_id": c.case_id,
        "label": "baseline" if c.is_baseline else c.label,
        "is_baseline": c.is_baseline,
        "result": c.result,
        "reason": c.reason,
        "active_tokens": c.active_tokens,
        "mismatches": c.mismatches,
        "mismatch_ratio": c.mismatch_ratio,
        "diff_mean": c.diff.mean,
        "diff_p50": c.diff.p50,
        "diff_p90": c.diff.p90,
        "diff_p99": c.diff.p99,
        "diff_max": c.diff.max,
        "approx_kl": c.approx_kl,
        "threshold": c.threshold,
        "threshold_dtype": c.threshold_dtype,
        "rollout_dtype": c.rollout_dtype,
        "training_dtype": c.training_dtype,
        "changed": json.dumps(dict(c.changed), sort_keys=True, default=str),
        "wall_s": c.wall_s,
        "attempt_id": c.attempt_id,
        "seal_verified": c.seal_verified,
        **{f"rc_{name}": rc.get(name) for name in METRICS},
    }
    return {k: _cell(v) for k, v in row.items()}


def render_csv(data: ReportData) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for case in data.cases:
        writer.writerow(_row(data.experiment_id, case))
    return buffer.getvalue()
