"""Campaign 5, resource faults: a full disk, a runtime that raises, a case that hangs.

* Full disk: the run writes to a small tmpfs (several sizes, so the disk fills during plan
  publication, payload writes and sealing); without mount rights, a child process under
  RLIMIT_FSIZE (SIGXFSZ ignored) instead. Every run fails with `artifacts.disk_full`, exit 2,
  no sealed attempt is partial or invalid, and after space is freed resume completes with
  verdicts bit-identical to a normal run.
* A runtime that raises mid-case: that case is `error` with the message; the sweep goes on.
* A case over its time budget (`case_timeout_s`) is stopped and recorded, never left hanging.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.reliability.relhelpers import (
    REPO,
    RUN_FLAGS,
    child_env,
    cli,
    cli_output,
    final_state,
    report,
    write_experiment,
)
from tests.reliability.relruntimes import INJECTED
from xconf.artifacts.store import PAYLOAD_FILES, SEAL_NAME, ExperimentStore
from xconf.verify import EXIT_DAMAGED, verify_run

EXP = "rel-s0"
# One 4 KiB page more each time: the disk fills at plan.jsonl, then at each payload of the
# first attempt in turn, then at its COMPLETE (an attempt's records, provenance and the
# records resume re-derives among them, need sizes up to 94 KiB for that); 160 KiB fills it
# at a later case.
TMPFS_KIB = (*range(2, 96, 2), 160)
FSIZE_LIMITS = (600, 4000)  # plan publication, then the first payload over the limit


def _mount(directory: Path, kib: int) -> bool:
    directory.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={kib}k", "tmpfs", str(directory)],
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):  # no mount binary, no rights: RLIMIT_FSIZE
        return False
    return done.returncode == 0


def _umount(directory: Path) -> None:
    subprocess.run(["umount", str(directory)], capture_output=True)


def _no_sealed_partial(root: Path) -> int:
    """Every attempt that carries COMPLETE is valid; returns the number of partial ones."""
    store = ExperimentStore(root, EXP)
    partial = 0
    for case in store.case_ids():
        for attempt in store.attempts(case):
            check = store.verify_attempt(attempt)
            if (attempt / "COMPLETE").exists():
                assert check.valid, check.reason
            else:
                partial += 1
    return partial


def _run_limited(experiment: Path, root: Path, limit: int) -> tuple[int, str]:
    code = (
        "import resource, signal, sys\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))\n"
        "from xconf.cli.main import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    argv = ["run", str(experiment), *RUN_FLAGS, "--output-root", str(root)]
    done = subprocess.run(
        [sys.executable, "-c", code, *argv],
        env=child_env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done.returncode, done.stderr


@pytest.mark.slow
def test_full_disk(tmp_path: Path) -> None:
    started = time.monotonic()
    experiment = write_experiment(tmp_path)
    reference_root = tmp_path / "reference"
    assert cli("run", experiment, *RUN_FLAGS, "--output-root", reference_root) == 1
    reference = final_state(reference_root / EXP)
    mount = tmp_path / "small"
    tmpfs = os.environ.get("XCONF_RELIABILITY_NO_TMPFS") != "1" and _mount(mount, TMPFS_KIB[0])
    if tmpfs:
        _umount(mount)
    sizes = TMPFS_KIB if tmpfs else FSIZE_LIMITS
    failures = partial_total = 0
    where: list[str] = []
    for size in sizes:
        if tmpfs:
            assert _mount(mount, size)
            root = mount / "root"
            try:
                code, out = cli_output("run", experiment, *RUN_FLAGS, "--output-root", root)
                saved = tmp_path / f"full-{size}"
                shutil.copytree(mount, saved, symlinks=True)  # as the full disk left it
            finally:
                _umount(mount)
            root = saved / "root"
        else:
            root = tmp_path / f"limited-{size}"
            code, out = _run_limited(experiment, root, size)
        assert code == 2, (size, out)
        assert "[artifacts.disk_full]" in out and "Traceback" not in out, (size, out)
        failures += 1
        where.append(Path(out.split("at '", 1)[1].split("'", 1)[0]).name)
        if root.exists():
            partial_total += _no_sealed_partial(root)
        # space is back: resume completes with the reference verdicts and tensors
        assert cli("run", experiment, *RUN_FLAGS, "--output-root", root) == 1
        assert final_state(root / EXP) == reference
        assert verify_run(root / EXP).exit_code != EXIT_DAMAGED
    if tmpfs:
        assert set(where) >= {SEAL_NAME, *PAYLOAD_FILES}, sorted(where)  # every payload, the seal
        assert set(where) & {"plan.jsonl", "experiment.json"}, where  # and the plan's publication
    seconds = time.monotonic() - started
    how = "tmpfs KiB" if tmpfs else "RLIMIT_FSIZE bytes"
    report(
        "full_disk",
        f"{failures}/{len(sizes)} full-disk runs ({how} {list(sizes)}) ended with "
        f"artifacts.disk_full, {partial_total} partial attempts left unsealed, "
        f"0 sealed partial, all resumed bit-identically; full at {where}, {seconds:.1f}s",
        {
            "mode": how,
            "sizes": list(sizes),
            "disk_full_errors": failures,
            "full_while_writing": where,
            "partial_unsealed": partial_total,
            "seconds": round(seconds, 1),
        },
    )


def _run_runtime(root: Path, target: str, timeout: float | None = None, **options: Any) -> Any:
    from xconf.config.strict import load_experiment_file
    from xconf.runtime.loading import instantiate_runtime
    from xconf.session import prepare, run_prepared

    experiment = write_experiment(root.parent / "in")
    spec = load_experiment_file(experiment)
    adapter = instantiate_runtime({"_target_": target, **options})
    prepared = prepare(spec, output_root=root, allow_smoke_operators=True, device="cpu")
    return run_prepared(prepared, adapter, resume=True, case_timeout_s=timeout)


def test_runtime_that_raises_mid_case(tmp_path: Path) -> None:
    root = tmp_path / "root"
    summary = _run_runtime(root, "tests.reliability.relruntimes:RaisingRuntime")
    results = {r.label: r for r in summary.records}
    failed = results["rollout.dtype=bfloat16"]
    assert failed.result == "error" and INJECTED in (failed.reason or "")
    assert [r.result for r in summary.records].count("error") == 1  # the sweep went on
    assert results["baseline"].result == "pass"
    attempt = root / EXP / "cases" / failed.case_id / failed.attempt_id
    doc = json.loads((attempt / "comparison.json").read_text())
    assert doc["error"]["code"] == "runtime.exception" and INJECTED in doc["error"]["message"]
    assert ExperimentStore(root, EXP).verify_attempt(attempt).valid  # sealed for the record
    # an error attempt is never reused: a healthy runtime scores the case again
    again = _run_runtime(root, "xconf.adapters.cpu_smoke.adapter:CpuSmokeRuntime")
    redo = {r.label: r for r in again.records}["rollout.dtype=bfloat16"]
    assert redo.result == "fail" and not redo.reused and redo.attempt_id != failed.attempt_id
    report("runtime_raises", "raising case recorded as error, sweep went on, resume re-scored", {})


@pytest.mark.parametrize("mode", ["sleep", "spin"])
def test_case_over_time_budget_is_stopped(tmp_path: Path, mode: str) -> None:
    root = tmp_path / "root"
    started = time.monotonic()
    summary = _run_runtime(
        root, "tests.reliability.relruntimes:SleepyRuntime", timeout=1.0, hang_s=120.0, mode=mode
    )
    seconds = time.monotonic() - started
    assert seconds < 60, seconds  # never left hanging (the fault would hang 120 s)
    results = {r.label: r for r in summary.records}
    stopped = results["rollout.dtype=bfloat16"]
    assert stopped.result == "error" and "time budget" in (stopped.reason or "")
    attempt = root / EXP / "cases" / stopped.case_id / stopped.attempt_id
    doc = json.loads((attempt / "comparison.json").read_text())
    assert doc["error"]["code"] == "runtime.case_timeout"
    others = [r.result for r in summary.records if r is not stopped]
    assert "error" not in others and len(others) == len(summary.records) - 1
    report(
        f"case_timeout_{mode}",
        f"hanging case ({mode}) stopped after its 1 s budget, run took {seconds:.1f}s",
        {"seconds": round(seconds, 1)},
    )


def test_case_timeout_from_hydra_and_cli(tmp_path: Path) -> None:
    """`case_timeout_s` (Hydra) and `--case-timeout` (plain CLI) reach the runner."""
    from hydra import compose, initialize_config_dir

    from xconf.cli.hydra_app import run_from_config
    from xconf.runtime.loading import conf_dir

    root = tmp_path / "hydra"
    overrides = [
        "+experiment=cpu_smoke",
        "allow_smoke_operators=true",
        "runtime._target_=tests.reliability.relruntimes:SleepyRuntime",
        "case_timeout_s=1",
        f"output_root={root}",
    ]
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
        started = time.monotonic()
        assert run_from_config(cfg, overrides, "cpu_smoke") == 1
        assert time.monotonic() - started < 60
        bad = compose("config", overrides=[*overrides[:3], "case_timeout_s=-3"])
        assert run_from_config(bad, [*overrides[:3], "case_timeout_s=-3"], "cpu_smoke") == 2
    errors = [
        json.loads(p.read_text())["error"]
        for p in root.rglob("comparison.json")
        if json.loads(p.read_text())["result"] == "error"
    ]
    assert [e["code"] for e in errors] == ["runtime.case_timeout"]
    experiment = write_experiment(tmp_path / "in")
    code, out = cli_output(
        "run", experiment, *RUN_FLAGS, "--case-timeout", "0", "--output-root", tmp_path / "cli"
    )
    assert code == 2 and "[config.invalid_value]" in out and not (tmp_path / "cli").exists()
