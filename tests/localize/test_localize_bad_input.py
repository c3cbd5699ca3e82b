"""`xconf localize` on bad input: exit 2, the coded error on stderr, nothing written."""

from __future__ import annotations

import shutil
import sys

import pytest

from tests.adapters.conftest import needs_hf
from tests.conftest import S0_JSON, snapshot
from tests.localize.conftest import case_of, run_dir
from xconf.cli import hydra_app


@needs_hf
def test_unknown_case(clean_run, xconf_cli) -> None:
    before = snapshot(run_dir(clean_run))
    rc, _, err = xconf_cli("localize", run_dir(clean_run), "c-0000000000000000")
    assert rc == 2 and "[localize.unknown_case]" in err and "'CASE_ID'" in err
    assert snapshot(run_dir(clean_run)) == before


@needs_hf
def test_case_without_a_sealed_attempt(clean_run, xconf_cli, tmp_path) -> None:
    copy = tmp_path / run_dir(clean_run).name
    shutil.copytree(run_dir(clean_run), copy)
    shutil.rmtree(copy / "localize", ignore_errors=True)
    case = case_of(clean_run)
    for seal in (copy / "cases" / case).glob("*/COMPLETE"):
        seal.unlink()  # a partial attempt: never localized
    before = snapshot(copy)
    rc, _, err = xconf_cli("localize", copy, case)
    assert rc == 2 and "[localize.no_sealed_attempt]" in err
    assert snapshot(copy) == before


def test_not_a_run_dir(xconf_cli, tmp_path) -> None:
    rc, _, err = xconf_cli("localize", tmp_path, "c-0000000000000000")
    assert rc == 2 and "[verify.bad_run_dir]" in err
    assert not any(tmp_path.iterdir())


def test_architecture_without_a_name_map(xconf_cli, tmp_path) -> None:
    """The S0 synthetic model has no tap name map; `run --localize` reports it per case."""
    out = tmp_path / "out"
    rc, _, err = xconf_cli(
        "run",
        S0_JSON,
        "--runtime",
        "cpu-smoke",
        "--allow-smoke-operators",
        "--output-root",
        out,
        "--localize",
    )
    assert rc == 1  # the run's own verdicts: some S0 cases fail on purpose
    assert "[localize.no_name_map]" in err
    run = out / "cpu-smoke-json"
    assert not (run / "localize").exists()
    case = sorted(p.name for p in (run / "cases").iterdir())[0]
    before = snapshot(run)
    rc, _, err = xconf_cli("localize", run, case)
    assert rc == 2 and "[localize.no_name_map]" in err and "cpu-smoke" in err
    assert snapshot(run) == before


def test_xconf_run_localize_option(monkeypatch, tmp_path, capsys) -> None:
    """`xconf-run ... localize=true` localizes the failing cases (here: refused, no name map)."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    argv = ["+experiment=cpu_smoke", "allow_smoke_operators=true", f"output_root={out}"]
    monkeypatch.setattr(sys, "argv", ["xconf-run", *argv, "localize=true"])
    with pytest.raises(SystemExit) as info:
        hydra_app.main()
    _, err = capsys.readouterr()
    assert info.value.code == 1
    assert "[localize.no_name_map]" in err
    assert not any((p / "localize").exists() for p in out.iterdir())
