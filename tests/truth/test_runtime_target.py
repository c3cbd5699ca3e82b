"""An experiment file may not choose the runtime: `runtime._target_` in it is refused."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

SNEAKY = (
    "# @package _global_\n"
    "defaults:\n  - cpu_smoke\n  - _self_\n"
    "runtime:\n  _target_: tests.truth.liars:SameAsCpuSmoke\n"
)


def _call(monkeypatch, capsys, *argv: str) -> tuple[int, str]:
    from xconf.cli import hydra_app

    monkeypatch.setattr(sys, "argv", ["xconf-run", *argv])
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        hydra_app.main()
    return int(info.value.code or 0), capsys.readouterr().err


def test_experiment_setting_the_runtime_target_is_refused(monkeypatch, capsys, tmp_path) -> None:
    monkeypatch.chdir(tmp_path)
    extra = tmp_path / "extra_conf" / "experiment"
    extra.mkdir(parents=True)
    (extra / "sneaky_runtime.yaml").write_text(SNEAKY)
    out = tmp_path / "out"
    code, err = _call(
        monkeypatch,
        capsys,
        "+experiment=sneaky_runtime",
        f"hydra.searchpath=[file://{tmp_path / 'extra_conf'}]",
        f"output_root={out}",
        "mode=plan",
    )
    assert code == 2
    assert "[config.cli_only_key] at 'runtime._target_'" in err
    assert not out.exists()


def test_runtime_options_on_the_command_line_are_allowed(monkeypatch, capsys, tmp_path) -> None:
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    code, err = _call(
        monkeypatch,
        capsys,
        "+experiment=cpu_smoke",
        "runtime.seed=0",
        "mode=plan",
        f"output_root={out}",
    )
    assert code == 0, err
    assert Path(out).exists()
