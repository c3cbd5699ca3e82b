"""The production operators as framework cases: selected by id, no planner change, passing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_s0_experiment_selecting_the_production_operator_passes(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "xconf.cli.hydra_app",
            "+experiment=s0_production_logp",
            f"output_root={tmp_path}",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    experiment = tmp_path / "s0-production-logp"
    rows = [json.loads(line) for line in (experiment / "plan.jsonl").read_text().splitlines()]
    assert {r["operators"]["training"] for r in rows} == {
        "xconf.reference_logp",
        "xconf.vocab_parallel_logp",
    }
    verdicts = [json.loads(p.read_text()) for p in experiment.glob("cases/*/*/comparison.json")]
    assert len(verdicts) == 2 and {v["result"] for v in verdicts} == {"pass"}
    provenance = [
        json.loads(p.read_text())["operator_provenance"]
        for p in experiment.glob("cases/*/*/actual.json")
    ]
    used = {entry["backend_id"] for entries in provenance for entry in entries}
    assert "xconf.vocab_parallel_logp" in used
