"""Fork server of the crash and concurrency campaigns: import xconf once, fork per request.

Protocol: one JSON request per stdin line, one JSON reply per stdout line.

* ``{"op": "trace", "file", "root", "trace"}``: run the experiment to completion and write
  the ordered list of fault points (``[label, phase]``) it passed through to ``trace``;
* ``{"op": "kill", "file", "root", "at"}``: run it and SIGKILL the child at fault point
  ``at`` (1-based, in trace order); the reply says how the child ended;
* ``{"op": "run", "file", "root", "summary"}``: run it to completion (a resume) and write
  the records (case, attempt, reused, result) to ``summary``;
* ``{"op": "many", "argvs", "summaries", "go"}`` (concurrency campaign): fork one runner
  per argv, reply ``{"started": n}``, let them all start when the ``go`` file appears, then
  reply ``{"done": [...]}`` once every runner has exited.

Fault points wrap xconf from the outside (monkeypatching, no hook in the core): before and
after every planning step, engine construction and model build, scoring call, comparison,
attempt allocation and file publication, plus inside each publication (after the temporary
file is written and before it is fsynced; before and after its link into place).
The server itself never runs a torch operation, so forking it is safe.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import types
from pathlib import Path
from typing import Any

import torch

import xconf.adapters.cpu_smoke.adapter as adapter_mod
import xconf.adapters.cpu_smoke.engines as engines_mod
import xconf.artifacts.safe_io as safe_io
import xconf.artifacts.store as store_mod
import xconf.cli.main as cli_main
import xconf.session as session
import xconf.side_scoring as side_scoring_mod

RUN_FLAGS = ["--runtime", "cpu-smoke", "--allow-smoke-operators"]


class Faults:
    def __init__(self, kill_at: int | None) -> None:
        self.kill_at = kill_at
        self.count = 0
        self.trace: list[tuple[str, str]] = []
        self.writing: str | None = None

    def point(self, label: str, phase: str) -> None:
        self.count += 1
        self.trace.append((label, phase))
        if self.count == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)


def _wrap(faults: Faults, owner: Any, attr: str, label: str, phase: Any) -> None:
    original = getattr(owner, attr)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        where = phase(*args) if callable(phase) else phase
        faults.point(f"{label}:before", where)
        value = original(*args, **kwargs)
        faults.point(f"{label}:after", where)
        return value

    setattr(owner, attr, wrapper)


def _write_phase(name: str) -> str:
    if name == store_mod.SEAL_NAME:
        return "seal"
    if name == "experiment.json":
        return "planning"
    return f"write:{name}"


def install(faults: Faults) -> None:
    _wrap(faults, session, "plan_experiment", "plan_experiment", "planning")
    _wrap(faults, session, "build_execution_plan", "bind_operators", "planning")
    _wrap(faults, store_mod.ExperimentStore, "publish_plan", "publish_plan", "planning")
    _wrap(faults, adapter_mod.CpuSmokeRuntime, "build_engine", "build_engine", "engine")
    _wrap(faults, engines_mod, "build_model", "build_model", "engine")
    for cls in (engines_mod.RolloutEngine, engines_mod.TrainingEngine):
        _wrap(faults, cls, "score", f"{cls.__name__}.score", "scoring")
        _wrap(faults, cls, "_logits", f"{cls.__name__}.logits", "scoring")
    _wrap(faults, side_scoring_mod, "compare", "compare", "comparison")  # where it is called
    _wrap(faults, store_mod, "allocate_attempt_dir", "allocate_attempt", "allocation")

    publish = store_mod.publish_bytes

    def publish_bytes(directory: Path, name: str, data: bytes, **kwargs: Any) -> str:
        faults.writing = name
        faults.point(f"publish {name}:before", _write_phase(name))
        digest = publish(directory, name, data, **kwargs)
        faults.point(f"publish {name}:after", _write_phase(name))
        faults.writing = None
        return digest

    store_mod.publish_bytes = publish_bytes  # type: ignore[assignment]

    def inside(real: Any, label: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            if faults.writing is None:
                return real(*args, **kwargs)
            phase = _write_phase(faults.writing)
            faults.point(f"{label} {faults.writing}:before", phase)
            value = real(*args, **kwargs)
            faults.point(f"{label} {faults.writing}:after", phase)
            return value

        return call

    # safe_io sees a copy of `os` whose fsync/link are fault points during a publication.
    proxy = types.SimpleNamespace(**{k: getattr(os, k) for k in dir(os) if not k.startswith("__")})
    proxy.fsync = inside(os.fsync, "fsync")
    proxy.link = inside(os.link, "link")
    safe_io.os = proxy  # type: ignore[assignment]


class _Summary:
    def __init__(self, target: str | None) -> None:
        self.target = target
        real = session.run_prepared

        def run_prepared(*args: Any, **kwargs: Any) -> Any:
            summary = real(*args, **kwargs)
            if self.target:
                rows = [[r.case_id, r.attempt_id, r.reused, r.result] for r in summary.records]
                Path(self.target).write_text(json.dumps(rows), "utf-8")
            return summary

        session.run_prepared = run_prepared  # type: ignore[assignment]


def child(request: dict[str, Any]) -> int:
    torch.set_num_threads(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    faults = Faults(request.get("at"))
    if request["op"] in ("trace", "kill"):
        install(faults)
    _Summary(request.get("summary"))
    code = cli_main.main(["run", request["file"], *RUN_FLAGS, "--output-root", request["root"]])
    if request["op"] == "trace":
        Path(request["trace"]).write_text(json.dumps(faults.trace), "utf-8")
    return code


def _status(status: int) -> dict[str, Any]:
    return {
        "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        "rc": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
    }


def many(request: dict[str, Any]) -> None:
    """Fork one runner per argv; all wait for the ``go`` file, then run at once."""
    pids = []
    for argv, summary in zip(request["argvs"], request["summaries"], strict=True):
        pid = os.fork()
        if pid == 0:
            code = 99
            try:
                torch.set_num_threads(1)
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, 1)
                errors = os.open(f"{summary}.err", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(errors, 2)
                _Summary(summary)
                while not os.path.exists(request["go"]):
                    time.sleep(0.002)
                code = cli_main.main(argv)
            finally:
                os._exit(code)
        pids.append(pid)
    sys.stdout.write(json.dumps({"started": len(pids)}) + "\n")
    sys.stdout.flush()
    replies = [_status(os.waitpid(pid, 0)[1]) for pid in pids]
    sys.stdout.write(json.dumps({"done": replies}) + "\n")
    sys.stdout.flush()


def serve() -> None:
    for line in sys.stdin:
        request = json.loads(line)
        if request["op"] == "many":
            many(request)
            continue
        pid = os.fork()
        if pid == 0:
            code = 99
            try:
                code = child(request)
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        sys.stdout.write(json.dumps(_status(status)) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    serve()
