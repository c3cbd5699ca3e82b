"""Starting a real multi-rank world for the adapter tests (parent side only): a free port
for the rendezvous and spawned ranks joined within a deadline, terminated on the way out."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ranks(
    fn: Callable[..., None], args: tuple[Any, ...], nprocs: int, timeout_s: float
) -> None:
    """``fn(rank, *args)`` in ``nprocs`` spawned processes; fails the test past ``timeout_s``
    (a rank that raised fails it at once, through ``join``)."""
    import torch.multiprocessing as mp

    ctx = mp.start_processes(fn, args=args, nprocs=nprocs, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout_s
    try:
        while not ctx.join(timeout=5):
            if time.monotonic() > deadline:
                pytest.fail(f"{nprocs} ranks did not finish within {timeout_s} s")
    finally:
        for proc in ctx.processes:
            if proc.is_alive():
                proc.terminate()
