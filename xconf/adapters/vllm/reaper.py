"""The worker processes of a closed multiprocess engine exit in the background, within a budget.

A TP > 1 engine runs one worker process per rank. On ``close`` vLLM signals them to exit and
then waits (seconds: each worker tears its own engine state down and its interpreter exits)
before it returns, so every TP case spent that wait on the critical path between two cases.
Nothing the next engine needs depends on that wait: the workers' process groups, shared
queues and devices are their own, and the parent's part of the shutdown still runs in order.

The wait is handed to a reaper thread instead (vLLM's own escalation: a grace period, then
SIGTERM, then SIGKILL), under one rule that bounds memory:

* **CPU:** before an engine is built, while workers of closed engines are still exiting,
  the machine must have room for the new engine beside them: ``MemAvailable`` (which
  already counts the exiting workers' memory as used) minus the new engine's estimate must
  stay above ``RESERVE_FRACTION`` of ``MemTotal``; otherwise the build waits for them.
* **Any other device** (GPU): the build always waits for them. Their device memory is not
  counted in the parent's view of free memory until they have exited, and a vLLM engine
  sizes itself from the device's free memory, so overlap could not be bounded there.

``drain`` waits for every pending reap; the runtime calls it when it closes, and ``atexit``
calls it as a last resort.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESERVE_FRACTION = 0.10  # of MemTotal, kept free while old workers exit beside a new engine
_MEMINFO = Path("/proc/meminfo")


def meminfo_bytes(path: Path = _MEMINFO) -> tuple[int, int] | None:
    """(MemTotal, MemAvailable) in bytes, or None where the kernel does not report them."""
    try:
        fields = dict(line.split(":", 1) for line in path.read_text().splitlines() if ":" in line)
        total, available = (int(fields[k].split()[0]) * 1024 for k in ("MemTotal", "MemAvailable"))
    except (OSError, KeyError, ValueError, IndexError):
        return None
    return total, available


def engine_memory_estimate(model_path: str, kv_cache_bytes: int, ranks: int) -> int:
    """Bytes an engine may need: its weights as stored, twice (a 16-bit checkpoint computed in
    float32), plus each rank's KV cache of ``kv_cache_bytes``."""
    stored = sum(p.stat().st_size for p in Path(model_path).glob("*.safetensors"))
    return 2 * stored + kv_cache_bytes * ranks


def on_cpu() -> bool:
    """Whether vLLM runs on the CPU here (its platform), where ``MemAvailable`` is exact."""
    try:
        from vllm.platforms import current_platform
    except ImportError:  # pragma: no cover - vLLM is imported before any engine is built
        return False
    return bool(current_platform.is_cpu())


class WorkerReaper:
    """Worker processes of closed engines, waited for by background threads."""

    def __init__(self, meminfo: Callable[[], tuple[int, int] | None] = meminfo_bytes) -> None:
        self._meminfo = meminfo
        self._pending: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.deferred = 0  # closes whose wait went to the background
        self.waited_for_room = 0  # builds that waited for exiting workers first

    def defer(self, executor: Any) -> bool:
        """Make ``executor.shutdown()`` hand its wait for the workers to this reaper.

        False (and nothing changed) for an executor without worker processes.
        """
        wait = getattr(executor, "_ensure_worker_termination", None)
        if not callable(wait) or not getattr(executor, "workers", None):
            return False

        def in_background(procs: list[Any]) -> None:
            thread = threading.Thread(target=wait, args=(procs,), name="xconf-reaper", daemon=True)
            thread.start()
            with self._lock:
                self._pending.append(thread)
                self.deferred += 1

        executor._ensure_worker_termination = in_background
        return True

    def pending(self) -> int:
        with self._lock:
            self._pending = [t for t in self._pending if t.is_alive()]
            return len(self._pending)

    def make_room(self, needed_bytes: int, *, cpu: bool | None = None) -> None:
        """Before a build that needs about ``needed_bytes``: wait unless it fits (see module).

        ``cpu``: whether the engines run on the CPU (None: vLLM's platform says)."""
        if not self.pending():
            return
        memory = self._meminfo() if (on_cpu() if cpu is None else cpu) else None
        if memory is not None:
            total, available = memory
            if available - needed_bytes >= RESERVE_FRACTION * total:
                return
        self.waited_for_room += 1
        self.drain()

    def drain(self) -> None:
        """Wait for every pending reap (each is bounded by vLLM's grace period and SIGKILL)."""
        with self._lock:
            threads, self._pending = self._pending, []
        for thread in threads:
            thread.join()


REAPER = WorkerReaper()
atexit.register(REAPER.drain)
