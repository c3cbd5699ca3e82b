"""Start-up: `xconf --help`, `xconf plan` and the Hydra app's `--cfg` / `mode=plan` (single and
multirun) import no tensor library, and a 256-case plan costs well under a second of CPU.

Each command runs in a fresh interpreter, so ``sys.modules`` shows what that command alone
imported. Budgets are checked on CPU time (user + sys of the child): the CI box is shared, and
wall time there measures the neighbours; the wall time is printed beside it.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import S0_JSON

HEAVY = ("torch", "vllm", "transformers")
# Runs the entry point, then reports which heavy modules the process had loaded at exit.
PROBE = """
import atexit, json, sys
atexit.register(lambda: print("XCONF-MODULES " + json.dumps(
    sorted(m for m in sys.modules if m.split(".")[0] in {heavy!r}))))
sys.argv = [{prog!r}, *sys.argv[1:]]
from {module} import main
sys.exit(main())
"""
ENTRY = {"xconf": "xconf.cli.main", "xconf-run": "xconf.cli.hydra_app"}


def document_256(tmp_path: Path) -> Path:
    """The S0 example with 255 batch sizes: baseline + 255 = the planner's cap of 256 cases."""
    document = json.loads(S0_JSON.read_text("utf-8"))
    document["experiment_id"] = "startup-256"
    base = document["baseline"]["batch"]["size"]
    sizes = [size for size in range(1, 260) if size != base][:255]
    document["interventions"] = [{"path": "batch.size", "values": sizes}]
    path = tmp_path / "s0-256.json"
    path.write_text(json.dumps(document), "utf-8")
    return path


def probe(prog: str, *argv: str, cwd: Path) -> tuple[list[str], float, float, str]:
    """(heavy modules loaded, CPU seconds, wall seconds, output) of one command."""
    code = PROBE.format(heavy=set(HEAVY), prog=prog, module=ENTRY[prog])
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", code, *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("XCONF-MODULES ")]
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0 and lines, output
    return json.loads(lines[-1].split(" ", 1)[1]), cpu, wall, output


SINGLE = [
    ("xconf", "--help"),
    ("xconf-run", "--help"),
    ("xconf-run", "+experiment=cpu_smoke", "--cfg", "job"),
    ("xconf-run", "+experiment=cpu_smoke", "mode=plan", "output_root=out"),
]


@pytest.mark.parametrize("command", SINGLE, ids=[" ".join(c[1:]) for c in SINGLE])
def test_no_tensor_library_at_start_up(command: tuple[str, ...], tmp_path: Path) -> None:
    heavy, _, _, _ = probe(*command, cwd=tmp_path)
    assert heavy == []


def test_plan_of_256_cases_imports_no_torch_and_fits_the_budget(tmp_path: Path) -> None:
    document = document_256(tmp_path)
    runs = [probe("xconf", "plan", str(document), cwd=tmp_path) for _ in range(3)]
    heavy, _, _, output = runs[0]
    assert heavy == []
    assert "plan startup-256: 256 cases" in output
    assert (tmp_path / "outputs" / "startup-256" / "plan.jsonl").is_file()
    cpu = min(r[1] for r in runs)
    wall = min(r[2] for r in runs)
    print(f"xconf plan, 256 cases: cpu {cpu:.2f}s, wall {wall:.2f}s (best of 3)")
    assert cpu < 1.0


def test_multirun_of_256_cases_plans_without_torch(tmp_path: Path) -> None:
    # 10 cases declared by cpu_smoke + 246 batch sizes from the shell = the cap of 256.
    argv = (
        "-m",
        "+experiment=cpu_smoke",
        "mode=plan",
        "output_root=out",
        "batch.size=range(5,251)",
        "hydra/launcher=torchrun",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
    )
    heavy, cpu, wall, output = probe("xconf-run", *argv, cwd=tmp_path)
    assert heavy == []
    assert "launched nothing" in output
    assert len((tmp_path / "out" / "cpu-smoke" / "plan.jsonl").read_text().splitlines()) == 256
    print(f"xconf-run -m mode=plan, 256 cases: cpu {cpu:.2f}s, wall {wall:.2f}s")
    assert cpu < 5.0
