"""`xconf localize` on bad input: exit 2, the coded error on stderr, nothing written."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.adapters.conftest import needs_hf
from tests.conftest import REPO, S0_JSON, snapshot
from tests.localize.conftest import case_of, run_dir
from xconf.artifacts.localization import latest
from xconf.cli import hydra_app
from xconf.verify import verify_run


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


def _cli(*argv: object) -> subprocess.CompletedProcess[str]:
    """The real CLI in its own process: descriptors 1 and 2 are the run log while engines
    run, exactly as on a terminal (an in-process capture would hide that)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    args = [sys.executable, "-m", "xconf.cli.main", *map(str, argv)]
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # two CLI processes (a run, then localize): ~6 s idle
def test_architecture_without_a_name_map(tmp_path) -> None:
    """The S0 synthetic model has no tap name map: `run --localize` says so per failing case
    on the terminal (not only in xconf.log) and records it; `xconf localize` refuses it
    with exit 2 and writes nothing."""
    out = tmp_path / "out"
    argv = ("run", S0_JSON, "--runtime", "cpu-smoke", "--allow-smoke-operators")
    done = _cli(*argv, "--output-root", out, "--localize")
    assert done.returncode == 1, done.stderr[-2000:]  # the run's own verdicts: S0 fails some
    failed = [line for line in done.stdout.splitlines() if "[localize.no_name_map]" in line]
    assert failed and all(line.startswith("localize c-") for line in failed), done.stdout
    run = out / "cpu-smoke-json"
    recorded = {p.name: latest(run, p.name) for p in (run / "localize").iterdir()}
    assert len(recorded) == len(failed)
    for doc in recorded.values():
        assert doc is not None and doc["status"] == "error"
        assert doc["error"]["code"] == "localize.no_name_map"
    page = (run / "report.html").read_text()
    assert 'id="localize"' in page and "localize failed: [localize.no_name_map]" in page
    assert verify_run(run).count("damaged") == 0
    case = sorted(p.name for p in (run / "cases").iterdir())[0]
    before = snapshot(run)
    done = _cli("localize", run, case)
    assert done.returncode == 2 and "[localize.no_name_map]" in done.stderr
    assert "cpu-smoke" in done.stderr
    assert snapshot(run) == before


def test_xconf_run_localize_option(monkeypatch, tmp_path, capfd) -> None:
    """`xconf-run ... localize=true` localizes the failing cases (here: refused, no name map,
    each refusal printed and recorded)."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    argv = ["+experiment=cpu_smoke", "allow_smoke_operators=true", f"output_root={out}"]
    monkeypatch.setattr(sys, "argv", ["xconf-run", *argv, "localize=true"])
    with pytest.raises(SystemExit) as info:
        hydra_app.main()
    printed, _ = capfd.readouterr()  # the console writes to the terminal descriptor
    assert info.value.code == 1
    assert "[localize.no_name_map]" in printed
    (run,) = out.iterdir()
    docs = [latest(run, p.name) for p in (run / "localize").iterdir()]
    assert docs and all(d is not None and d["status"] == "error" for d in docs)
