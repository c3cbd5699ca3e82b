"""Hydra composition -> strict experiment document, and command-line-only keys (in-process)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import OmegaConf, open_dict

from tests.conftest import S3_JSON
from xconf.cli.hydra_app import run_from_config
from xconf.config.hydra_document import experiment_document, reject_config_set_cli_keys
from xconf.config.strict import load_experiment_file, parse_experiment
from xconf.errors import ConfigError
from xconf.planner import plan_experiment
from xconf.runtime.loading import conf_dir


def compose_app(overrides: list[str], *, choices: bool = False):
    """Compose like `xconf-run` does; returns (cfg without hydra, runtime choice).

    Composition costs ~0.15 s of CPU: tests compose only when Hydra itself is under test.
    """
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose("config", overrides=overrides, return_hydra_config=choices)
    if not choices:
        return cfg, "cpu_smoke"
    choice = cfg.hydra.runtime.choices.get("runtime")
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg, choice


@pytest.fixture(scope="module")
def cpu_smoke_cfg():
    return compose_app(["+experiment=cpu_smoke"], choices=True)


def run_app(overrides: list[str], out: Path) -> int:
    overrides = [*overrides, f"output_root={out}"]
    cfg, choice = compose_app(overrides)
    return run_from_config(cfg, overrides, choice)


@pytest.fixture
def searchpath(tmp_path: Path):
    """A temporary config dir added to Hydra's search path; returns (dir, override)."""
    root = tmp_path / "extra_conf"
    (root / "experiment").mkdir(parents=True)
    (root / "runtime").mkdir()
    return root, f"hydra.searchpath=[file://{root}]"


def _sneaky(root: Path, name: str, body: str) -> None:
    header = "# @package _global_\ndefaults:\n  - cpu_smoke\n  - _self_\n"
    (root / "experiment" / f"{name}.yaml").write_text(header + body)


# -- composition -----------------------------------------------------------------------------


def test_cpu_smoke_composes_to_a_strict_document(cpu_smoke_cfg) -> None:
    cfg, choice = cpu_smoke_cfg
    assert choice == "cpu_smoke"
    document = experiment_document(cfg)
    assert set(document["baseline"]) == {"batch", "rollout", "training", "logp"}
    assert not {"mode", "allow_smoke_operators", "output_root", "resume", "runtime"} & set(document)
    spec = parse_experiment(document, require_schema_version=False)
    assert len(plan_experiment(spec).cases) == 10


def test_no_experiment_selected(tmp_path, capsys) -> None:
    assert run_app([], tmp_path / "out") == 2
    assert "[config.no_experiment]" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_mode_plan_on_the_command_line_is_accepted(tmp_path, capsys) -> None:
    out = tmp_path / "out"
    assert run_app(["+experiment=qwen3_8b", "mode=plan"], out) == 0
    rows = (out / "qwen3-8b-alignment" / "plan.jsonl").read_text().splitlines()
    json_plan = plan_experiment(load_experiment_file(S3_JSON))
    assert [json.loads(r)["case_id"] for r in rows] == [c.case_id for c in json_plan.cases]
    assert len(rows) == 11
    assert "11 cases" in capsys.readouterr().out
    assert not (out / "qwen3-8b-alignment" / "cases").exists()  # no engine, no attempt


def test_a_typo_override_does_not_compose() -> None:
    with pytest.raises(HydraException):
        compose_app(["+experiment=cpu_smoke", "rollout.dtypo=x"])


def test_unknown_experiment_does_not_compose() -> None:
    with pytest.raises(HydraException):
        compose_app(["+experiment=no_such_experiment"])


# -- bad input through overrides: exit 2, code and path, nothing written ----------------------

N300 = "[" + ",".join(str(i) for i in range(1, 301)) + "]"
BAD_OVERRIDES = [
    (["+foo=1"], "config.unknown_key", "foo"),
    (["+identity.foo=1"], "config.unknown_key", "identity.foo"),
    (["+rollout.foo=1"], "plan.unsupported_path", "baseline.rollout.foo"),
    (["+threshold=0.1"], "config.threshold_forbidden", "threshold"),
    (["+rollout.atol=0.1"], "config.threshold_forbidden", "baseline.rollout.atol"),
    (["+scenario.tolerance=1"], "config.threshold_forbidden", "scenario.tolerance"),
    (["+rollout.world_size=2"], "plan.derived_knob", "baseline.rollout.world_size"),
    (["batch.size=abc"], "plan.wrong_value_type", "baseline.batch.size"),
    (["~training.sharding"], "plan.missing_baseline_value", "baseline.training.sharding"),
    (["interventions.0.values=[]"], "plan.empty_intervention", "interventions[0].values"),
    (["interventions.1.path=batch.size"], "plan.duplicate_intervention", "interventions[1].path"),
    (["strategy=pairwise"], "plan.pairwise_paths_required", "pairwise_paths"),
    ([f"interventions.0.values={N300}"], "plan.too_large", "interventions"),
    (["experiment_id=a/b"], "config.unsafe_id", "experiment_id"),
    (["+execution=plan"], "config.cli_only_key", "execution"),
    (["+scenario.expected_status=pass"], "config.cli_only_key", "scenario.expected_status"),
    (["mode=sweep"], "config.invalid_value", "mode"),
    ([], "operator.smoke_not_authorized", "logp.backend"),  # smoke operators, not authorized
]


@pytest.mark.parametrize(
    ("overrides", "code", "path"),
    [
        pytest.param(o, c, p, id=" ".join(o)[:40] or "unauthorized-smoke")
        for o, c, p in BAD_OVERRIDES
    ],
)
def test_bad_overrides_exit_2_and_write_nothing(tmp_path, capsys, overrides, code, path) -> None:
    extra = ["allow_smoke_operators=true"] if overrides else []
    out = tmp_path / "out"
    assert run_app(["+experiment=cpu_smoke", *extra, *overrides], out) == 2
    err = capsys.readouterr().err
    assert f"[{code}]" in err and f"'{path}'" in err
    assert not out.exists()


@pytest.mark.parametrize(
    ("override", "code"),
    [("+rollout.atol=0.1", "config.threshold_forbidden"), ("experiment_id=..", "config.unsafe_id")],
)
def test_bad_overrides_in_plan_mode(tmp_path, capsys, override, code) -> None:
    out = tmp_path / "out"
    assert run_app(["+experiment=cpu_smoke", "mode=plan", override], out) == 2
    assert f"[{code}]" in capsys.readouterr().err
    assert not out.exists()


# -- an experiment group may not set mode, runtime or authorization --------------------------


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ("mode: plan\n", "mode"),
        ("allow_smoke_operators: true\n", "allow_smoke_operators"),
        ("plan_only: true\n", "plan_only"),
        ("scenario:\n  plan_only: true\n", "scenario.plan_only"),
    ],
)
def test_experiment_file_cannot_set_cli_keys(searchpath, tmp_path, capsys, body, path) -> None:
    root, override = searchpath
    _sneaky(root, "sneaky", body)
    out = tmp_path / "out"
    assert run_app(["+experiment=sneaky", override], out) == 2
    err = capsys.readouterr().err
    assert "[config.cli_only_key]" in err and f"'{path}'" in err
    assert not out.exists()


def test_experiment_file_cannot_choose_the_runtime(searchpath, tmp_path, capsys) -> None:
    root, override = searchpath
    (root / "runtime" / "other.yaml").write_text(
        "_target_: xconf.adapters.cpu_smoke.adapter:CpuSmokeRuntime\nseed: 1\n"
    )
    _sneaky(root, "picks_runtime", "")
    text = (root / "experiment" / "picks_runtime.yaml").read_text()
    text = text.replace("  - cpu_smoke\n", "  - cpu_smoke\n  - override /runtime: other\n")
    (root / "experiment" / "picks_runtime.yaml").write_text(text)
    out = tmp_path / "out"
    overrides = ["+experiment=picks_runtime", override, "allow_smoke_operators=true"]
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose(
            "config", overrides=[*overrides, f"output_root={out}"], return_hydra_config=True
        )
    choice = cfg.hydra.runtime.choices.get("runtime")
    with open_dict(cfg):
        del cfg["hydra"]
    assert choice == "other"
    assert run_from_config(cfg, overrides, choice) == 2
    assert "[config.cli_only_key] at 'runtime'" in capsys.readouterr().err
    assert not out.exists()
    # ...while the same choice on the command line is accepted
    cfg, choice = compose_app(["+experiment=cpu_smoke", override, "runtime=other"], choices=True)
    reject_config_set_cli_keys(cfg, ["runtime=other"], choice)


@pytest.mark.parametrize(
    ("values", "overrides", "ok"),
    [
        ({"mode": "plan"}, ["mode=plan"], True),
        ({"mode": "plan"}, [], False),
        ({"allow_smoke_operators": True}, ["allow_smoke_operators=true"], True),
        ({"allow_smoke_operators": True}, ["+allow_smoke_operators=true"], True),
        ({"allow_smoke_operators": True}, ["output_root=x"], False),
        ({}, [], True),
    ],
)
def test_reject_config_set_cli_keys(values, overrides, ok) -> None:
    cfg = OmegaConf.create({"mode": "run", "allow_smoke_operators": False, **values})
    if ok:
        reject_config_set_cli_keys(cfg, overrides, "cpu_smoke")
    else:
        with pytest.raises(ConfigError) as info:
            reject_config_set_cli_keys(cfg, overrides, "cpu_smoke")
        assert info.value.code == "config.cli_only_key"
        assert info.value.path == next(iter(values))


def test_composed_config_round_trips_through_json(cpu_smoke_cfg, tmp_path) -> None:
    cfg, _ = cpu_smoke_cfg
    document = experiment_document(cfg)
    file = tmp_path / "exp.json"
    file.write_text(json.dumps({"schema_version": "cross_config.experiment_config.v1", **document}))
    assert load_experiment_file(file) == parse_experiment(document, require_schema_version=False)
