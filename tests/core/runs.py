"""In-process runs of a v1 document on the cpu-smoke runtime, for runner-level tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from xconf.adapters.cpu_smoke.adapter import CpuSmokeRuntime
from xconf.artifacts.store import ExperimentStore
from xconf.case_record import RunSummary
from xconf.config.strict import parse_experiment
from xconf.session import prepare, run_prepared


def run_doc(
    doc: dict[str, Any],
    output_root: Path,
    *,
    resume: bool = True,
    adapter: Any = None,
    allow_smoke: bool = True,
    reuse_sides: bool = True,
) -> RunSummary:
    prepared = prepare(
        parse_experiment(doc),
        output_root=output_root,
        allow_smoke_operators=allow_smoke,
        device="cpu",
    )
    return run_prepared(
        prepared, adapter or CpuSmokeRuntime(), resume=resume, reuse_sides=reuse_sides
    )


def only(doc: dict[str, Any], **interventions: list[Any]) -> dict[str, Any]:
    """``doc`` with exactly these interventions (keyword names use '__' for '.')."""
    doc["interventions"] = [
        {"path": k.replace("__", "."), "values": v} for k, v in interventions.items()
    ]
    return doc


def attempt_doc(summary: RunSummary, label: str, name: str) -> Any:
    record = next(r for r in summary.records if r.label == label)
    path = Path(summary.experiment_dir) / "cases" / record.case_id / record.attempt_id / name
    return json.loads(path.read_text("utf-8"))


def store_of(summary: RunSummary) -> ExperimentStore:
    path = Path(summary.experiment_dir)
    return ExperimentStore(path.parent, path.name)
