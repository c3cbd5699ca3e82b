"""`xconf-run` as the tests start it: in a subprocess, as a user runs it (the one place its
test environment is set), or in this process, for a refusal that must write nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]


def xconf_run(cwd: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``xconf-run ARGS`` (the Hydra app) started from ``cwd``: xconf imported from this
    checkout, one intra-op thread (the CI machines are small and shared) and a wide terminal
    (tables are not wrapped, so the tests can read them); never raises on a non-zero exit."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
        "COLUMNS": "200",
    }
    return subprocess.run(
        [sys.executable, "-m", "xconf.cli.hydra_app", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def refused_in_process(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    code: str,
    named: str,
    label: Any,
) -> str:
    """``xconf-run`` (``argv`` without the program name) in this process: it must exit 2 with
    ``[code]`` and ``named`` in its message and no traceback; returns what it printed on
    stderr. ``label`` names the input in a failure."""
    from xconf.cli import hydra_app

    monkeypatch.setattr(sys, "argv", ["xconf-run", *argv])
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        hydra_app.main()
    err = capsys.readouterr().err
    assert info.value.code == 2, (label, err)
    assert f"[{code}]" in err and named in err, (label, err)
    assert "Traceback" not in err, (label, err)
    return err


def run_composed(
    overrides: list[str],
    output_root: Path,
    *,
    edit: Any = None,
    resume: bool = True,
) -> tuple[Any, Any]:
    """The experiment ``xconf-run OVERRIDES`` composes, run in this process through the same
    service (the strict document, ``session.prepare``, ``run_prepared``): returns the run's
    summary and the runtime it built. ``edit(cfg)`` may change the composed config first (a
    subset of an identity's prompts)."""
    from hydra import compose, initialize_config_dir

    from xconf.config.hydra_document import experiment_document
    from xconf.config.strict import parse_experiment
    from xconf.runtime.loading import instantiate_runtime
    from xconf.session import prepare, run_prepared

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    if edit is not None:
        edit(cfg)
    spec = parse_experiment(experiment_document(cfg), require_schema_version=False)
    adapter = instantiate_runtime(cfg.runtime)  # as `xconf-run` builds it
    prepared = prepare(spec, output_root=output_root, allow_smoke_operators=False, device="cpu")
    return run_prepared(prepared, adapter, resume=resume), adapter
