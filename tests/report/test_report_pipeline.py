"""The report of a run the real pipeline wrote (cpu-smoke runtime, the S0 JSON example)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from xconf.report.cli import main_report

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cross_config_s0_cpu_smoke.json"


@pytest.mark.slow
def test_report_of_a_real_cpu_smoke_run(tmp_path: Path) -> None:
    from xconf.cli.main import main

    if not EXAMPLE.is_file():
        pytest.skip(f"{EXAMPLE} is not in this checkout")
    root = tmp_path / "out"
    args = ["run", str(EXAMPLE), "--runtime", "cpu-smoke", "--allow-smoke-operators"]
    assert main([*args, "--output-root", str(root)]) in (0, 1)  # 1: a case did not pass
    (run_dir,) = [p for p in root.iterdir() if p.is_dir()]
    assert main_report([str(run_dir), "-o", str(tmp_path / "r.json"), "--quiet"]) == 0
    assert main(["report", str(run_dir), "-o", str(tmp_path / "r.html"), "--quiet"]) == 0

    data = json.loads((tmp_path / "r.json").read_text())
    cases = data["cases"]
    assert cases[0]["is_baseline"] and cases[0]["result"] == "pass"
    failures = [c for c in cases if c["result"] == "fail"]
    assert failures and cases[1 : 1 + len(failures)] == failures
    worst = failures[0]
    assert worst["mismatch_ratio"] == max(c["mismatch_ratio"] for c in failures)
    assert worst["histogram"]["threshold_line"] == worst["threshold"]
    assert all(c["seal_verified"] and c["recomputed"].startswith("agrees") for c in cases)
    assert all(c["materialization"] for c in cases)
    assert data["contracts"][0]["version"] and len(data["contracts"][0]["sha256"]) == 64

    html = (tmp_path / "r.html").read_text()
    marker = re.search(rf'data-case-id="{worst["case_id"]}" data-threshold-line="([^"]+)"', html)
    assert marker is not None and float(marker.group(1)) == worst["threshold"]
