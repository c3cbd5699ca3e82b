"""`xconf-run` as a user runs it: four real subprocesses (started two at a time to save
time) and, in-process through the same `main()`, the calls that never start a job."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests.commands import xconf_run
from tests.conftest import S3_JSON


def _xconf_run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return xconf_run(cwd, *args, timeout=300)


SNEAKY = "# @package _global_\ndefaults:\n  - cpu_smoke\n  - _self_\nmode: plan\n"


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, object]:
    base = tmp_path_factory.mktemp("hydra")
    cwd = base / "cwd"
    cwd.mkdir()
    extra = base / "extra_conf" / "experiment"
    extra.mkdir(parents=True)
    (extra / "sneaky.yaml").write_text(SNEAKY)
    roots = {name: base / name for name in ("smoke", "plan", "sneaky")}

    def smoke_twice():
        args = (
            "+experiment=cpu_smoke",
            "allow_smoke_operators=true",
            f"output_root={roots['smoke']}",
        )
        return _xconf_run(cwd, *args), _xconf_run(cwd, *args)

    jobs = {
        "smoke": smoke_twice,
        "plan": lambda: _xconf_run(
            cwd, "+experiment=qwen3_8b", "mode=plan", f"output_root={roots['plan']}"
        ),
        "sneaky": lambda: _xconf_run(
            cwd,
            "+experiment=sneaky",
            f"hydra.searchpath=[file://{base / 'extra_conf'}]",
            f"output_root={roots['sneaky']}",
        ),
    }
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(job) for name, job in jobs.items()}
        results: dict[str, object] = {name: f.result() for name, f in futures.items()}
    results["roots"] = roots
    results["cwd"] = cwd
    return results


@pytest.mark.slow
def test_cpu_smoke_runs_prints_the_table_and_exits_1(runs) -> None:
    first, _ = runs["smoke"]
    assert first.returncode == 1, first.stderr
    assert "cpu-smoke: 10 cases" in first.stdout
    assert first.stdout.count("(new)") == 10
    # The verdict table's rows (the attribution table and headline below it name knobs too).
    for line in (ln for ln in first.stdout.splitlines() if ln.startswith("│ c-")):
        if "logp_offset" in line:
            assert "fail" in line
        if "reference_logp" in line:
            assert "pass" in line
    root = runs["roots"]["smoke"] / "cpu-smoke"
    seals = list(root.glob("cases/*/a-0001/COMPLETE"))
    assert len(seals) == 10


@pytest.mark.slow
def test_cpu_smoke_rerun_reuses_every_case(runs) -> None:
    _, second = runs["smoke"]
    assert second.returncode == 1, second.stderr
    assert second.stdout.count("(reused)") == 10 and "(new)" not in second.stdout
    assert "engines built 0" in second.stdout


@pytest.mark.slow
def test_hydra_run_dirs_stay_where_hydra_puts_them(runs) -> None:
    assert (runs["cwd"] / "outputs").is_dir()  # Hydra's own run directory, under the cwd
    assert not list((runs["cwd"] / "outputs").rglob("COMPLETE"))  # artifacts went to the root


@pytest.mark.slow
def test_qwen3_plan_mode_plans_the_json_examples_cases(runs, xconf_cli, tmp_path) -> None:
    result = runs["plan"]
    assert result.returncode == 0, result.stderr
    assert "11 cases" in result.stdout
    plan = runs["roots"]["plan"] / "qwen3-8b-alignment" / "plan.jsonl"
    assert xconf_cli("plan", S3_JSON, "--output-root", tmp_path)[0] == 0
    json_plan = tmp_path / "qwen3-8b-alignment" / "plan.jsonl"

    def ids(path: Path) -> list[str]:
        return [json.loads(line)["case_id"] for line in path.read_text().splitlines()]

    assert len(ids(plan)) == 11
    assert ids(plan) == ids(json_plan)
    assert plan.read_text() == json_plan.read_text()  # same rows, byte for byte
    assert not (plan.parent / "cases").exists()


@pytest.mark.slow
def test_experiment_setting_mode_is_refused(runs) -> None:
    result = runs["sneaky"]
    assert result.returncode == 2
    assert "[config.cli_only_key] at 'mode'" in result.stderr
    assert not runs["roots"]["sneaky"].exists()


# -- in-process: the entry point's own handling of Hydra flags and composition errors --------


@pytest.fixture
def xconf_run_inprocess(monkeypatch, tmp_path, capsys):
    from xconf.cli import hydra_app

    monkeypatch.chdir(tmp_path)

    def call(*argv: str) -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "argv", ["xconf-run", *argv])
        capsys.readouterr()
        with pytest.raises(SystemExit) as info:
            hydra_app.main()
        out, err = capsys.readouterr()
        return int(info.value.code or 0), out, err

    return call


def test_cfg_job_prints_the_composed_config(xconf_run_inprocess) -> None:
    code, out, _ = xconf_run_inprocess("+experiment=cpu_smoke", "--cfg", "job")
    assert code == 0
    for needle in ("experiment_id: cpu-smoke", "mode: run", "interventions:", "batch:"):
        assert needle in out


def test_help_lists_the_config_groups(xconf_run_inprocess) -> None:
    code, out, _ = xconf_run_inprocess("--help")
    assert code == 0
    for group in ("experiment", "baseline", "runtime", "scenario", "identity", "intervention"):
        assert group in out


@pytest.mark.parametrize(
    "args",
    [("+experiment=cpu_smoke", "rollout.dtypo=x"), ("+experiment=no_such_thing",)],
    ids=["typo", "unknown-experiment"],
)
def test_composition_errors_exit_2_and_write_nothing(xconf_run_inprocess, tmp_path, args) -> None:
    out_root = tmp_path / "out"
    code, _, err = xconf_run_inprocess(*args, f"output_root={out_root}")
    assert code == 2
    assert args[-1].split("=")[1] in err
    assert not out_root.exists()
    assert not (tmp_path / "outputs").exists()


def test_the_app_announces_itself_as_xconf_run(xconf_run_inprocess) -> None:
    code, out, _ = xconf_run_inprocess("--help")
    assert code == 0
    assert "xconf-run is powered by Hydra" in out and "hydra_app" not in out
    code, out, _ = xconf_run_inprocess(
        "+experiment=cpu_smoke", "--cfg", "hydra", "--package", "hydra.job"
    )
    assert code == 0 and "name: xconf-run" in out  # so its log is xconf-run.log


def test_info_plugins_lists_each_launcher_once_and_no_internal_class(xconf_run_inprocess) -> None:
    code, out, _ = xconf_run_inprocess("--info", "plugins")
    assert code == 0
    launchers = out.split("Launcher:")[1].split("Sweeper:")[0].split()
    names = [n for n in launchers if not n.startswith("-")]
    assert {"XconfLocalLauncher", "XconfSlurmLauncher", "TorchrunLauncher"} <= set(names)
    assert not [n for n in names if n.startswith("_")], names
    assert len(names) == len(set(names)), names


def test_unknown_runtime_option_exits_2_naming_the_key(xconf_run_inprocess, tmp_path) -> None:
    out_root = tmp_path / "out"
    code, _, err = xconf_run_inprocess(
        "+experiment=cpu_smoke", "+runtime.model_path=x", f"output_root={out_root}"
    )
    assert code == 2, err
    assert "[runtime.unknown_option] at 'runtime.model_path'" in err
    assert not out_root.exists()


@pytest.mark.slow
def test_a_fresh_process_scores_bitwise_like_the_json_run(runs, first_run) -> None:
    """Same identity, scenario and knobs: same case ids and the same bytes, across processes."""
    hydra_cases = runs["roots"]["smoke"] / "cpu-smoke" / "cases"
    json_cases = first_run[0] / "cpu-smoke-json" / "cases"
    case_ids = sorted(p.name for p in hydra_cases.iterdir())
    assert case_ids == sorted(p.name for p in json_cases.iterdir())
    for case_id in case_ids:
        a, b = hydra_cases / case_id / "a-0001", json_cases / case_id / "a-0001"
        for name in ("score_rollout", "score_training", "token_diffs"):
            ta = load_file(str(a / f"{name}.safetensors"))
            tb = load_file(str(b / f"{name}.safetensors"))
            assert sorted(ta) == sorted(tb)
            for key in ta:
                assert ta[key].dtype == tb[key].dtype
                assert ta[key].numpy().tobytes() == tb[key].numpy().tobytes(), (case_id, key)
        assert (a / "comparison.json").read_bytes() == (b / "comparison.json").read_bytes()
