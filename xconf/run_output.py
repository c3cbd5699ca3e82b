"""Third-party output of a run goes to the run's log file; the terminal shows xconf's own.

vLLM, transformers and torch write hundreds of lines while engines build: logging handlers
on stdout/stderr, ``warnings``, tqdm bars, and C/C++ code writing to file descriptors 1
and 2 directly. Inside :func:`third_party_output` (the scoring part of a run) descriptors
1 and 2 point at a temporary file, so all of that is caught whoever wrote it and whenever
its handler was made; at the end of the block (also on an error or Ctrl-C) it is appended
to ``<experiment dir>/xconf.log``, which exists only once some run had such output (a
rerun that reuses every case leaves the directory untouched). xconf's own console
(progress, then the verdict table after the block) keeps drawing on the terminal through a
duplicate of the original descriptor 1. ``verbose=True`` leaves everything on the
terminal, as before, and writes no log.

Rich's live progress swaps ``sys.stdout``/``sys.stderr`` for proxies that print through
the console (above the bar): inside the block the real streams are put back, so a write
from a library reaches its descriptor (the log), not the console.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xconf.artifacts.safe_io import append_stream

RUN_LOG = "xconf.log"  # beside experiment.json; appended by every run and sweep job


@dataclass(frozen=True)
class OutputPolicy:
    """How a run shows third-party output: ``console`` is xconf's own (kept on the
    terminal); ``None`` when nothing of xconf's draws while cases run (a sweep job)."""

    verbose: bool = False
    console: Any = None


def _flush_all() -> None:
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(Exception):
            if stream is not None:
                stream.flush()
    # C stdio buffers of native code (printf from extensions) before the descriptors move.
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).fflush(None)


def _unproxied(stream: Any) -> Any:
    return getattr(stream, "rich_proxied_file", stream)


@contextlib.contextmanager
def third_party_output(experiment_dir: Path, policy: OutputPolicy | None) -> Iterator[None]:
    """Catch descriptors 1 and 2 for the block into the run log (nothing when verbose/None)."""
    if policy is None or policy.verbose:
        yield
        return
    try:
        saved = (os.dup(1), os.dup(2))
    except OSError:  # no descriptors to move (a daemon): nothing to capture
        yield
        return
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    console = policy.console
    previous_file = getattr(console, "_file", None)
    terminal = io.TextIOWrapper(
        io.FileIO(saved[0], "w", closefd=False), encoding="utf-8", line_buffering=True
    )
    streams = (sys.stdout, sys.stderr)
    with tempfile.TemporaryFile() as captured:
        _flush_all()
        try:
            os.dup2(captured.fileno(), 1)
            os.dup2(captured.fileno(), 2)
            sys.stdout, sys.stderr = _unproxied(streams[0]), _unproxied(streams[1])
            if console is not None:
                console.file = terminal
            yield
        finally:
            _flush_all()
            if console is not None:
                console.file = previous_file
            sys.stdout, sys.stderr = streams
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            with contextlib.suppress(Exception):
                terminal.close()  # flushes; its descriptor is closed just below
            for fd in saved:
                os.close(fd)
            _append_log(experiment_dir / RUN_LOG, captured, stamp)


def _append_log(path: Path, captured: Any, stamp: str) -> None:
    """Append what was caught (if anything) under a header naming the process and time."""
    if captured.seek(0, os.SEEK_END) == 0:
        return
    if not path.parent.is_dir():  # refused before anything was written: back to the terminal
        captured.seek(0)
        sys.stderr.write(captured.read().decode("utf-8", "replace"))
        sys.stderr.flush()
        return
    header = f"== xconf: third-party output, pid {os.getpid()}, {stamp} ==\n".encode()
    append_stream(path.parent, path.name, header, captured)
