"""Time the drift report on a synthetic sweep: `python bench/bench_report.py [CASES] [T]`.

Writes a run directory in the documented artifact format (tests/report/report_fixtures.py),
then times loading + seal verification, HTML rendering and JSON rendering separately, and
the HTML report's total, reporting wall and CPU seconds (wall includes waiting for a shared
CPU: on a busy machine the CPU seconds are the closer estimate of an idle run's wall time).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "report"))

from report_fixtures import CaseSpec, logprobs, write_run

from xconf.report.build import build_report
from xconf.report.writer import render


def main(cases: int = 256, length: int = 64) -> None:
    base = logprobs(4, length, 0)
    active = np.ones(base.shape, dtype=bool)
    rng = np.random.default_rng(0)
    specs = [CaseSpec({}, base, base, active, kind="baseline")]
    for i in range(cases - 1):
        noise = rng.normal(0, 10.0 ** rng.uniform(-8, -2), size=base.shape).astype(np.float32)
        specs.append(CaseSpec({"batch.size": i + 3}, base, base + noise, active))
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = write_run(Path(tmp), "bench", specs)
        wall, cpu = time.perf_counter(), time.process_time()
        data = build_report(run_dir)
        build_wall, build_cpu = time.perf_counter() - wall, time.process_time() - cpu
        print(f"{'load+build':>12}: {build_wall:6.2f}s wall {build_cpu:6.2f}s cpu")
        for fmt in ("html", "json"):
            wall, cpu = time.perf_counter(), time.process_time()
            text = render(data, fmt)
            fmt_wall, fmt_cpu = time.perf_counter() - wall, time.process_time() - cpu
            print(f"{fmt:>12}: {fmt_wall:6.2f}s wall {fmt_cpu:6.2f}s cpu  {len(text) / 1e6:.1f} MB")
            if fmt == "html":  # what `xconf report` does: load, build, render the page
                print(
                    f"{'html report':>12}: {build_wall + fmt_wall:6.2f}s wall "
                    f"{build_cpu + fmt_cpu:6.2f}s cpu (load+build+html; target < 8 s)"
                )


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
