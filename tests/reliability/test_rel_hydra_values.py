"""Campaign 3, Hydra values: each bad value is a coded exit 2 through the real `xconf-run`
entry point, and nothing at all is written (no output root, no Hydra output directory).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.commands import refused_in_process

BAD: list[tuple[str, list[str], str, str]] = [
    ("run_dir_file", ["hydra.run.dir=afile"], "config.invalid_value", "hydra.run.dir"),
    ("run_dir_through_file", ["hydra.run.dir=afile/x"], "config.invalid_value", "hydra.run.dir"),
    ("output_root_null", ["output_root=null"], "config.wrong_type", "output_root"),
    ("output_root_list", ["output_root=[a,b]"], "config.wrong_type", "output_root"),
    ("output_root_empty", ["output_root=''"], "config.wrong_type", "output_root"),
    ("resume_no", ["resume=no"], "config.wrong_type", "resume"),
    ("resume_off", ["resume=off"], "config.wrong_type", "resume"),
    ("resume_false_string", ["resume='false'"], "config.wrong_type", "resume"),
    ("resume_zero", ["resume=0"], "config.wrong_type", "resume"),
    ("verbose_yes", ["verbose=yes"], "config.wrong_type", "verbose"),
    ("case_timeout_huge", ["case_timeout_s=1e300"], "config.invalid_value", "case_timeout_s"),
    ("case_timeout_inf", ["case_timeout_s=inf"], "config.invalid_value", "case_timeout_s"),
    (
        "contract_source_url",
        ["contract_source=https://example.invalid/contract.json"],
        "config.invalid_value",
        "contract_source",
    ),
    ("env_in_id", ["experiment_id=${oc.env:USER,x}"], "config.interpolation", "experiment_id"),
    (
        "env_in_metadata",
        ["+scenario.notes=${oc.env:HOME}"],
        "config.interpolation",
        "scenario.notes",
    ),
    ("node_in_knob", ["batch.size=${rollout.tensor_parallel_size}"], "config.interpolation", ""),
]

MULTIRUN = ("run_dir_file", "output_root_list", "resume_no", "env_in_id")


@pytest.mark.slow
@pytest.mark.parametrize("multirun", [False, True], ids=["run", "multirun"])
def test_bad_hydra_values_exit_2_and_write_nothing(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    multirun: bool,
) -> None:

    # Under -m the same checks run (Hydra's multirun callback): a few suffice.
    cases = [c for c in BAD if c[0] in MULTIRUN] if multirun else BAD
    for name, overrides, code, where in cases:
        if multirun and name.startswith("run_dir"):
            overrides = [o.replace("hydra.run.dir", "hydra.sweep.dir") for o in overrides]
            where = "hydra.sweep.dir"
        cwd = tmp_path / f"{name}-{multirun}"
        cwd.mkdir()
        (cwd / "afile").write_text("a file, not a directory")
        monkeypatch.chdir(cwd)
        argv = ["-m", "batch.size=1,2"] if multirun else []
        argv += ["+experiment=cpu_smoke", "mode=plan", *overrides]
        err = refused_in_process(monkeypatch, capsys, argv, code, where, name)
        assert sorted(p.name for p in cwd.iterdir()) == ["afile"], (name, err)


def test_real_booleans_and_plain_values_still_plan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from xconf.cli import hydra_app

    monkeypatch.chdir(tmp_path)
    argv = ["xconf-run", "+experiment=cpu_smoke", "mode=plan", "resume=false", "verbose=true"]
    argv += ["case_timeout_s=600", "contract_source=ws1", f"output_root={tmp_path / 'o'}"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as info:
        hydra_app.main()
    assert info.value.code == 0, capsys.readouterr().err
    assert (tmp_path / "o" / "cpu-smoke" / "experiment.json").is_file()


# Fourth campaign: refusals the task (or a launcher) makes, after Hydra could have written.
# Before: exit 2, but Hydra's run directory (outputs/DATE/TIME/.hydra) or the output root
# with a published plan was left behind.
TASK_REFUSALS: list[tuple[str, list[str], str, str]] = [
    (
        "empty_dump",
        ["+experiment=s2_cpu", "identity=from_dump", "identity.dump=''", "mode=plan"],
        "config.missing_key",
        "identity.dump",
    ),
    (
        "ray_connect_timeout",
        [
            "-m",
            "batch.size=1,2",
            "+experiment=cpu_smoke",
            "allow_smoke_operators=true",
            "hydra/launcher=xconf_ray",
            "hydra.launcher.connect_timeout_s=-1",
        ],
        "launch.settings.invalid",
        "connect_timeout_s",
    ),
]


@pytest.mark.parametrize("name", [c[0] for c in TASK_REFUSALS])
def test_a_refusal_after_hydra_started_leaves_nothing(
    name: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, argv, code, where = next(c for c in TASK_REFUSALS if c[0] == name)
    monkeypatch.chdir(tmp_path)
    err = refused_in_process(monkeypatch, capsys, [*argv, "output_root=out"], code, where, name)
    assert sorted(tmp_path.iterdir()) == [], (name, err)
