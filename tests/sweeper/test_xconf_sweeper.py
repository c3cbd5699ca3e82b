"""The xconf sweeper through the real `xconf-run -m` command line."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper

from tests import commands

REPO = Path(__file__).resolve().parents[2]
SMOKE = ["+experiment=cpu_smoke", "allow_smoke_operators=true"]


def xconf_run(
    tmp_path: Path, *overrides: str, sweep_dir: str = "mr"
) -> subprocess.CompletedProcess[str]:
    out, sweep = f"output_root={tmp_path / 'out'}", f"hydra.sweep.dir={tmp_path / sweep_dir}"
    return commands.xconf_run(tmp_path, "-m", *overrides, out, sweep, timeout=300)


def plan_rows(tmp_path: Path, experiment: str = "cpu-smoke") -> list[dict]:
    text = (tmp_path / "out" / experiment / "plan.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


def test_plugin_is_discovered() -> None:
    names = [p.__name__ for p in Plugins.instance().discover(Sweeper)]
    assert "XconfSweeper" in names


@pytest.fixture(scope="module")
def swept(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    tmp = tmp_path_factory.mktemp("sweep")
    return tmp, xconf_run(tmp, *SMOKE, "rollout.dtype=float32,bfloat16", "batch.size=1,2,3")


def test_sweep_is_one_factor_not_a_product(
    swept: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    tmp, result = swept
    assert result.returncode == 1, result.stderr  # the offset case fails by design
    rows = plan_rows(tmp)
    # The experiment's 10 interventions; the shell adds batch.size=3 only (float32 is the
    # baseline value, bfloat16 and batch.size=1 were already declared and are reported).
    assert len(rows) == 11
    assert all(len(row["changed"]) <= 1 for row in rows)
    assert {json.dumps(r["changed"]) for r in rows} >= {'{"batch.size": 3}', "{}"}
    assert "duplicate intervention reported: rollout.dtype=bfloat16" in result.stdout
    assert "smoke_only.logp_offset" in result.stdout and "fail" in result.stdout


def test_each_job_overrides_reproduce_its_case(
    swept: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    tmp, _ = swept
    rows = {json.dumps(r["changed"], sort_keys=True): r for r in plan_rows(tmp)}
    jobs = sorted((tmp / "mr").glob("*/.hydra/overrides.yaml"))
    assert len(jobs) == 11
    assert (tmp / "mr" / "multirun.yaml").is_file()
    for job in jobs:
        overrides = yaml.safe_load(job.read_text())
        changed = {}
        for item in overrides:
            key, _, value = item.partition("=")
            if key in ("batch.size",) or key.startswith(("rollout.", "training.", "logp.")):
                changed[key] = yaml.safe_load(value)
        assert json.dumps(changed, sort_keys=True) in rows


def test_rerun_reuses_every_sealed_case(
    swept: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    tmp, _ = swept
    again = xconf_run(
        tmp, *SMOKE, "rollout.dtype=float32,bfloat16", "batch.size=1,2,3", sweep_dir="mr2"
    )
    assert again.returncode == 1, again.stderr
    assert again.stdout.count("(reused)") == 11
    assert "(new)" not in again.stdout


def test_plan_mode_launches_nothing(tmp_path: Path) -> None:
    result = xconf_run(tmp_path, "+experiment=qwen3_8b", "mode=plan")
    assert result.returncode == 0, result.stderr
    assert len(plan_rows(tmp_path, "qwen3-8b-alignment")) == 11
    assert not list((tmp_path / "mr").glob("*/.hydra"))
    assert "launched nothing" in result.stdout


def test_sweep_over_the_cap_is_refused_before_any_job(tmp_path: Path) -> None:
    result = xconf_run(tmp_path, *SMOKE, "batch.size=range(5,300)")
    assert result.returncode == 2
    assert "[plan.too_large]" in result.stderr
    assert not (tmp_path / "out").exists()
    assert not (tmp_path / "mr").exists()


def test_sweeping_a_non_knob_is_refused(tmp_path: Path) -> None:
    result = xconf_run(tmp_path, *SMOKE, "output_root=a,b")
    assert result.returncode == 2
    assert "[sweep.not_a_knob]" in result.stderr


def test_a_failed_job_is_a_failed_case_not_a_crashed_sweep(tmp_path: Path) -> None:
    result = xconf_run(
        tmp_path,
        *SMOKE,
        "runtime._target_=tests.sweeper.failing_runtime:FailingConstructionRuntime",
        "+runtime.fail_on_batch_size=4",
    )
    assert result.returncode == 1, result.stderr
    # Every other case still ran; the dead job is reported as an error case.
    assert result.stdout.count("job failed") == 1
    assert "injected construction failure" in result.stdout
    # The verdict table's rows (one per case id; the attribution table below it names knobs).
    verdict_rows = [line for line in result.stdout.splitlines() if line.startswith("│ c-")]
    assert sum("│ pass" in row for row in verdict_rows) == 7  # bf16 rollout, offset fail
