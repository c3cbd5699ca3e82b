"""A 256-case sweep (the planner's cap) reports in under a minute on this machine."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from report_fixtures import CaseSpec, logprobs, write_run

from xconf.report.writer import write_report

CASES = 256
BUDGET_S = 60.0


def test_256_case_sweep_reports_within_budget(tmp_path: Path) -> None:
    base = logprobs(2, 16, 0)
    active = np.ones(base.shape, dtype=bool)
    rng = np.random.default_rng(7)
    specs = [CaseSpec({}, base, base, active, kind="baseline")]
    for i in range(CASES - 1):
        scale = 10.0 ** rng.uniform(-8, -3)
        noise = rng.normal(0, scale, size=base.shape).astype(np.float32)
        specs.append(CaseSpec({"batch.size": i + 3}, base, base + noise, active))
    run_dir = write_run(tmp_path / "out", "exp-256", specs)
    start = time.perf_counter()
    written = write_report(run_dir, tmp_path / "report.html")
    elapsed = time.perf_counter() - start
    print(f"256-case report built and rendered in {elapsed:.1f}s")
    assert elapsed < BUDGET_S
    assert len(written.data.cases) == CASES
    assert written.data.cases[0].is_baseline
    failures = written.data.failures
    assert failures and failures == written.data.cases[1 : 1 + len(failures)]
    text = written.path.read_text(encoding="utf-8")
    assert text.count('class="case-plot"') == CASES
