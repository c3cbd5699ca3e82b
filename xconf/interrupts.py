"""Ctrl-C and SIGTERM: stop, end every process we started, exit 130 / 143.

The first SIGINT or SIGTERM raises :class:`Interrupted` in the main thread. It is a
``BaseException`` on purpose: the runner and the launchers turn an ``Exception`` into a failed
case, and an interrupted case is not a verdict, so nothing may catch it on the way up. The
front-end (:func:`xconf.session.guarded`) ends every descendant and exits ``128 + signal``.
A second signal while that unwinds ends every descendant at once and exits immediately.

Child discovery goes through psutil (one implementation, no ``/proc`` parsing).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):
    """A stop signal arrived; the run ends without recording the case in flight."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = int(signum)

    @property
    def exit_code(self) -> int:
        """The shell's convention: 128 + signal number (130 for SIGINT, 143 for SIGTERM)."""
        return 128 + self.signum


def descendants(pid: int | None = None) -> list[Any]:
    """Every live descendant of ``pid`` (default: this process), as psutil processes."""
    import psutil

    try:
        return list(psutil.Process(pid or os.getpid()).children(recursive=True))
    except psutil.NoSuchProcess:
        return []


def children_matching(pid: int, needle: str) -> set[int]:
    """Direct children of ``pid`` whose command line contains ``needle``."""
    import psutil

    found: set[int] = set()
    try:
        children = psutil.Process(pid).children(recursive=False)
    except psutil.NoSuchProcess:
        return found
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            if any(needle in part for part in child.cmdline()):
                found.add(child.pid)
    return found


def end_processes(processes: Iterable[Any], grace_s: float = 3.0) -> int:
    """SIGTERM, wait up to ``grace_s``, then SIGKILL whoever is left; returns how many ended."""
    import psutil

    procs = list(processes)
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.terminate()
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(alive, timeout=grace_s)
    return len(procs)


def end_descendants(grace_s: float = 3.0) -> int:
    """End every process this one started (ranks, engine workers, their children).

    multiprocessing's resource tracker is left alone: it exits by itself when this process
    does (its pipe closes), and killing it early makes the next shared-memory release
    relaunch it and print spurious KeyError tracebacks.
    """
    import psutil

    ours = []
    for proc in descendants():
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            if not any("multiprocessing.resource_tracker" in part for part in proc.cmdline()):
                ours.append(proc)
    return end_processes(ours, grace_s)


@contextmanager
def stop_on_signals(signals: Iterable[int] = STOP_SIGNALS) -> Iterator[None]:
    """Turn the first of ``signals`` into :class:`Interrupted`; a second one ends everything.

    Only the main thread may install handlers; elsewhere this is a no-op.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        if len(received) == 1:
            raise Interrupted(signum)
        # Second signal: the user wants out now. No unwinding, no orphans.
        end_processes(descendants(), grace_s=0.5)
        os._exit(128 + signum)

    previous = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old if old is not None else signal.SIG_DFL)


@contextmanager
def deferred_stop(signals: Iterable[int] = STOP_SIGNALS) -> Iterator[Callable[[], None]]:
    """Within: a stop signal is only noted, and the yielded ``check()`` hands it on to the
    handler that was installed before (normally :func:`stop_on_signals`', which raises
    :class:`Interrupted`). For loops that wait in native code that cannot take an exception
    from a signal handler (Ray's core worker returns a ``SystemError`` then): call ``check()``
    between the calls, each of which is bounded."""
    if threading.current_thread() is not threading.main_thread():
        yield lambda: None
        return
    wanted = tuple(signals)
    noted: list[int] = []
    previous = {sig: signal.getsignal(sig) for sig in wanted}

    def note(signum: int, frame: FrameType | None) -> None:
        noted.append(signum)

    def restore() -> None:
        for sig, old in previous.items():
            signal.signal(sig, old if old is not None else signal.SIG_DFL)

    def check() -> None:
        if not noted or delivered:
            return
        delivered.append(noted[0])
        restore()
        handler = previous[noted[0]]
        if callable(handler):
            handler(noted[0], None)
        raise Interrupted(noted[0])

    delivered: list[int] = []
    for sig in wanted:
        signal.signal(sig, note)
    try:
        yield check
    finally:
        restore()
    check()  # a signal noted after the last check is not lost
