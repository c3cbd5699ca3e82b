"""Workers of closed multiprocess engines exit in the background, and a build waits for them
unless the machine has room for both."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path
from typing import Any

import pytest

from tests.adapters.conftest import needs_vllm
from xconf.adapters.vllm.reaper import RESERVE_FRACTION, WorkerReaper, meminfo_bytes

GIB = 1 << 30


def _sleeper(seconds: float) -> None:
    time.sleep(seconds)


class _Executor:
    """The two attributes of vLLM's MultiprocExecutor the reaper uses, over real processes."""

    def __init__(self, procs: list[Any]) -> None:
        self.workers = procs

    @staticmethod
    def _ensure_worker_termination(procs: list[Any]) -> None:
        for proc in procs:
            proc.join()

    def shutdown(self) -> None:
        self._ensure_worker_termination(self.workers)


def _exiting_worker(seconds: float) -> Any:
    proc = multiprocessing.get_context("spawn").Process(target=_sleeper, args=(seconds,))
    proc.start()
    return proc


def _closed_engine(reaper: WorkerReaper) -> Any:
    """An executor shut down under ``reaper`` whose one worker is still exiting."""
    proc = _exiting_worker(1.0)
    executor = _Executor([proc])
    reaper.defer(executor)
    executor.shutdown()
    return proc


def test_shutdown_returns_before_the_workers_exit_and_drain_waits_for_them() -> None:
    reaper = WorkerReaper()
    proc = _exiting_worker(1.0)
    executor = _Executor([proc])
    assert reaper.defer(executor)
    started = time.perf_counter()
    executor.shutdown()
    assert time.perf_counter() - started < 0.5
    assert proc.is_alive() and reaper.pending() == 1
    reaper.drain()
    assert not proc.is_alive() and reaper.pending() == 0
    assert reaper.deferred == 1


def test_an_executor_without_workers_is_left_alone() -> None:
    reaper = WorkerReaper()
    assert not reaper.defer(None)
    assert not reaper.defer(_Executor([]))


@pytest.mark.parametrize(
    ("available_gib", "needed_gib", "waits"),
    [(8.0, 1.0, False), (8.0, 7.5, True), (1.0, 0.0, False), (0.5, 0.0, True)],
)
def test_a_build_waits_unless_it_fits_beside_the_exiting_workers(
    available_gib: float, needed_gib: float, waits: bool
) -> None:
    total = 10 * GIB  # the reserve is RESERVE_FRACTION of it: 1 GiB
    assert RESERVE_FRACTION == 0.10
    reaper = WorkerReaper(meminfo=lambda: (total, int(available_gib * GIB)))
    proc = _closed_engine(reaper)
    reaper.make_room(int(needed_gib * GIB), cpu=True)
    assert proc.is_alive() is not waits
    assert reaper.waited_for_room == int(waits)
    reaper.drain()


def test_off_the_cpu_a_build_always_waits() -> None:
    reaper = WorkerReaper(meminfo=lambda: (100 * GIB, 99 * GIB))
    proc = _closed_engine(reaper)
    reaper.make_room(0, cpu=False)
    assert not proc.is_alive()


def test_unreadable_meminfo_means_wait(tmp_path: Path) -> None:
    assert meminfo_bytes(tmp_path / "missing") is None
    reaper = WorkerReaper(meminfo=lambda: None)
    proc = _closed_engine(reaper)
    reaper.make_room(0, cpu=True)
    assert not proc.is_alive()


def test_this_machine_reports_its_memory() -> None:
    memory = meminfo_bytes()
    assert memory is not None and 0 < memory[1] <= memory[0]


@needs_vllm
@pytest.mark.slow
def test_a_tp2_engine_closes_without_waiting_for_its_workers(model_record: Any) -> None:
    from xconf.adapters.vllm.engine import RolloutEngineConfig, VllmRolloutEngine
    from xconf.adapters.vllm.reaper import REAPER

    engine = VllmRolloutEngine(
        RolloutEngineConfig(model_path=model_record.path, tensor_parallel_size=2)
    )
    executor = engine.llm.llm_engine.engine_core.engine_core.model_executor
    procs = [w.proc for w in executor.workers]
    deferred = REAPER.deferred
    engine.close()
    assert REAPER.deferred == deferred + 1
    REAPER.drain()
    assert not any(p.is_alive() for p in procs)
