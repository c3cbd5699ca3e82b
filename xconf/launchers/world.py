"""Start a world of ranks through torch elastic (no shelling out) and run a function in each.

Each rank receives a JSON job description: an importable ``module:qualname`` target and
JSON keyword arguments (:mod:`xconf.launchers.rank_call`); rank 0 answers in JSON. No pickle
that xconf makes is ever loaded (multiprocessing's spawn only carries these strings).

The parent blocks in ``elastic_launch``; a watchdog thread bounds the whole launch because
torch elastic has no overall run timeout and a rank stuck in a collective only fails after
the process group's timeout. torch is imported lazily: Hydra imports launcher plugins during
discovery.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from xconf.artifacts.safe_io import write_file
from xconf.canonical import canonical_digest
from xconf.launchers.errors import (
    CaseDisagreementError,
    LaunchError,
    LaunchTimeoutError,
    RankFailedError,
    check_settings,
)

log = logging.getLogger(__name__)

# elastic_launch replaces these in the parent and leaves them replaced; we restore them.
_AGENT_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")


@dataclass(frozen=True)
class WorldSettings:
    """How to start a world; every field has a bounded default."""

    backend: str = "auto"  # auto: nccl when CUDA is available, else gloo
    pg_timeout_s: float = 300.0
    job_timeout_s: float = 1800.0
    omp_num_threads: int = 1
    start_method: str = "spawn"
    monitor_interval_s: float = 0.1
    shutdown_timeout_s: int = 5

    def validate(self) -> None:
        checks = (
            ("backend", self.backend in ("auto", "gloo", "nccl")),
            ("pg_timeout_s", self.pg_timeout_s > 0),
            ("job_timeout_s", self.job_timeout_s > 0),
            ("omp_num_threads", self.omp_num_threads >= 1),
            ("start_method", self.start_method in ("spawn", "forkserver", "fork")),
            ("monitor_interval_s", self.monitor_interval_s > 0),
            ("shutdown_timeout_s", self.shutdown_timeout_s >= 0),
        )
        check_settings(self, checks)


@dataclass(frozen=True)
class WorldRecord:
    """What a launch did, written next to the job's outputs (``launch.json``)."""

    run_id: str
    world_size: int
    backend: str
    world_shared: bool  # every case gets its own world: no reuse across jobs (yet)
    elapsed_s: float
    status: str
    error: str | None


def resolve_backend(requested: str) -> str:
    if requested != "auto":
        return requested
    import torch

    return "nccl" if torch.cuda.is_available() else "gloo"


def config_digest(payload: Any) -> bytes:
    """Fixed-size (32-byte) digest of a JSON-able payload, canonical key order."""
    return bytes.fromhex(canonical_digest(payload, default=str))


def verify_case_agreement(digest: bytes) -> None:
    """All-gather each rank's case digest and fail on any difference.

    Runs before the task's first collective so that ranks on different cases fail loudly
    instead of deadlocking in mismatched collectives.
    """
    import torch
    import torch.distributed as dist

    if len(digest) != 32:
        raise CaseDisagreementError("launch.case_digest.size", "digest must be 32 bytes", "")
    mine = torch.tensor(list(digest), dtype=torch.uint8)
    if dist.get_backend() == "nccl":
        mine = mine.cuda()
    gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, mine)
    digests = [bytes(t.cpu().tolist()).hex()[:16] for t in gathered]
    if len(set(digests)) != 1:
        raise CaseDisagreementError(
            "launch.case_disagreement",
            f"ranks run different cases (digest prefixes by rank: {digests})",
            "hydra.launcher",
        )


def _rank_entry(job: str, settings_json: str, pid_dir: str) -> str | None:
    """Top-level worker function (spawn names it by reference); every argument is a str."""
    from torch.distributed.elastic.multiprocessing.errors import get_error_handler

    handler = get_error_handler()
    handler.initialize()
    try:
        return run_rank(job, WorldSettings(**json.loads(settings_json)), pid_dir)
    except KeyboardInterrupt:
        # A terminal's Ctrl-C reaches every rank of the foreground group, and the agent ends
        # the ranks itself. This rank stops here (torch's wrapper takes the interrupt quietly);
        # a second Ctrl-C while it exits must not print a traceback from interpreter exit.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise
    except Exception as exc:
        # Writes the traceback to the error file the parent reads into ChildFailedError.
        handler.record_exception(exc)
        raise


def run_rank(job: str, settings: WorldSettings, pid_dir: str) -> str | None:
    """One rank, whoever started it (torch elastic here, a Ray actor in ``ray_rank``): joins the
    world named by ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT``, runs the job
    (:func:`rank_job_text`), leaves the world; rank 0's value as JSON."""
    rank = int(os.environ["RANK"])
    # The watchdog kills the pids recorded here if the launch overruns.
    (Path(pid_dir) / f"rank{rank}.pid").write_text(str(os.getpid()))
    # torch elastic (unlike the torchrun command) leaves OMP_NUM_THREADS unset, and N ranks
    # each using every core oversubscribe the machine.
    os.environ["OMP_NUM_THREADS"] = str(settings.omp_num_threads)
    import torch
    import torch.distributed as dist

    from xconf.launchers.rank_call import import_target, to_json
    from xconf.runtime.ranks import close_world

    torch.set_num_threads(settings.omp_num_threads)
    backend = resolve_backend(settings.backend)
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend, timeout=timedelta(seconds=settings.pg_timeout_s))
    try:
        # A name and JSON: importing the target runs only code that is installed already.
        description = json.loads(job)
        value = import_target(description["target"])(**description["kwargs"])
    finally:
        close_world()
    # Only rank 0's value is used, as JSON; the other ranks return nothing.
    return to_json(value, "the rank's return value") if rank == 0 else None


def rank_job_text(target: str, kwargs: Mapping[str, Any]) -> str:
    """The JSON job every rank receives: ``target`` (``module:qualname``) and JSON ``kwargs``,
    both checked here, so a name the ranks cannot import fails once, not in every rank."""
    from xconf.launchers.rank_call import import_target, to_json

    import_target(target)
    return json.dumps({"target": target, "kwargs": json.loads(to_json(dict(kwargs), "kwargs"))})


def _spawn_children(parent: int) -> set[int]:
    """Direct children of ``parent`` started by multiprocessing spawn (torch elastic workers)."""
    from xconf.interrupts import children_matching

    return children_matching(parent, "spawn_main")


class _Watchdog:
    """Kills the world's workers once ``timeout_s`` has passed, repeatedly until stopped."""

    def __init__(self, timeout_s: float, pid_dir: Path, before: set[int]) -> None:
        self._timeout_s = timeout_s
        self._pid_dir = pid_dir
        self._before = before
        self._stop = threading.Event()
        self.expired = False
        self._thread = threading.Thread(target=self._run, name="xconf-world-watchdog")
        self._thread.daemon = True

    def __enter__(self) -> _Watchdog:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _pids(self) -> set[int]:
        pids = {
            int(p.read_text())
            for p in self._pid_dir.glob("rank*.pid")
            if p.read_text().strip().isdigit()
        }
        # Workers that died or hung before writing their pid file are still our children.
        return pids | (_spawn_children(os.getpid()) - self._before)

    def _run(self) -> None:
        if self._stop.wait(self._timeout_s):
            return
        self.expired = True
        log.error("world watchdog expired after %.1fs; killing workers", self._timeout_s)
        while not self._stop.is_set():
            for pid in self._pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self._stop.wait(0.5)


def _save_signal_handlers() -> dict[int, Any]:
    if threading.current_thread() is not threading.main_thread():
        return {}
    sigs = [getattr(signal, n) for n in _AGENT_SIGNALS if hasattr(signal, n)]
    return {s: signal.getsignal(s) for s in sigs}


def _restore_signal_handlers(saved: dict[int, Any]) -> None:
    for sig, handler in saved.items():
        signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def launch_world(
    world_size: int,
    target: str,
    kwargs: Mapping[str, Any],
    settings: WorldSettings,
    run_dir: Path,
) -> tuple[Any, WorldRecord]:
    """Run ``target(**kwargs)`` in ``world_size`` ranks with an initialised process group.

    ``target`` is ``module:qualname`` of an importable function and ``kwargs`` JSON: each rank
    imports the one and parses the other (checked here first, ``launch.task.*``). Returns
    rank 0's value (JSON, parsed) and a record. A failing, dying or overrunning rank raises a
    :class:`LaunchError` subclass within a bounded time (``settings.job_timeout_s``).
    """
    settings.validate()
    if world_size < 1:
        raise LaunchError("launch.world_size", f"world size {world_size} < 1", "")
    job = rank_job_text(target, kwargs)
    from torch.distributed.elastic.multiprocessing.api import DefaultLogsSpecs, SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    run_id = f"xconf-{uuid.uuid4().hex[:12]}"
    # One pid directory per launch, so a stale file can never point the watchdog elsewhere.
    pid_dir = run_dir / ".pids" / run_id
    pid_dir.mkdir(parents=True, exist_ok=True)
    backend = resolve_backend(settings.backend)
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=world_size,
        run_id=run_id,
        # c10d with port 0 binds a free port, so concurrent launches never collide; the
        # defaults (etcd, 3 restarts) would need an etcd server and hide a failing case.
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        rdzv_configs={"timeout": max(1, int(settings.job_timeout_s))},
        max_restarts=0,
        monitor_interval=settings.monitor_interval_s,
        start_method=settings.start_method,
        logs_specs=DefaultLogsSpecs(log_dir=str(run_dir / "elastic")),
        shutdown_timeout=settings.shutdown_timeout_s,
    )
    saved = _save_signal_handlers()
    before = _spawn_children(os.getpid())
    start = time.monotonic()
    error: LaunchError | None = None
    value: Any = None
    with _Watchdog(settings.job_timeout_s, pid_dir, before) as dog:
        try:
            outputs = elastic_launch(config, _rank_entry)(
                job, json.dumps(asdict(settings)), str(pid_dir)
            )
            value = json.loads(outputs[0])
        except ChildFailedError as exc:
            error = _failure(exc, dog.expired, settings)
        except SignalException as exc:
            # The agent caught SIGINT/SIGTERM and has already ended the ranks. A stop request
            # is not a failed case: it goes up as Interrupted, past every `except Exception`.
            from xconf.interrupts import Interrupted

            raise Interrupted(int(exc.sigval)) from None
        except Exception as exc:  # the agent itself failed (rendezvous, ...)
            if dog.expired:
                error = _timeout(settings)
            else:
                error = LaunchError("launch.agent_failed", f"{type(exc).__name__}: {exc}", "")
        finally:
            _restore_signal_handlers(saved)
    record = WorldRecord(
        run_id=run_id,
        world_size=world_size,
        backend=backend,
        world_shared=False,
        elapsed_s=round(time.monotonic() - start, 3),
        status="failed" if error else "completed",
        error=str(error) if error else None,
    )
    write_file(run_dir / "launch.json", (json.dumps(asdict(record), indent=2) + "\n").encode())
    if error is not None:
        raise error
    return value, record


def _timeout(settings: WorldSettings) -> LaunchTimeoutError:
    return LaunchTimeoutError(
        "launch.timeout",
        f"world did not finish within {settings.job_timeout_s}s; workers were killed",
        "hydra.launcher.job_timeout_s",
    )


def _failure(exc: Any, expired: bool, settings: WorldSettings) -> LaunchError:
    if expired:
        return _timeout(settings)
    rank, failure = exc.get_first_failure()
    detail = failure.message
    if isinstance(detail, dict):  # the error file's payload: message + traceback
        detail = detail.get("message", detail)
    lines = str(detail or "").strip().splitlines()
    if failure.exitcode < 0:
        summary = f"killed by signal {-failure.exitcode}"
    elif not lines or not os.path.isfile(failure.error_file):
        # No error file: the rank exited (os._exit, crash) without raising a Python error.
        summary = "exited without raising a Python exception"
    else:
        summary = lines[0]
    return RankFailedError(
        "launch.rank_failed",
        f"rank {rank} failed (exit code {failure.exitcode}): {summary}",
        f"rank[{rank}]",
    )
