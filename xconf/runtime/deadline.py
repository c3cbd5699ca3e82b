"""A per-case time budget: SIGALRM stops a case that runs longer than ``case_timeout_s``."""

from __future__ import annotations

import math
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from xconf.errors import XconfError

# setitimer takes far larger values, but then every case fails to arm it: a budget over
# 30 days is a typo, refused before anything runs.
MAX_CASE_TIMEOUT_S = 30 * 24 * 3600.0


@contextmanager
def case_deadline(seconds: float | None) -> Iterator[None]:
    """Raise ``runtime.case_timeout`` in the main thread once ``seconds`` have passed.

    SIGALRM interrupts Python code and interruptible system calls; a runtime blocked inside
    a single native call is stopped only when that call returns to Python (a hung collective
    needs the launcher's process-level timeout).
    """
    if seconds is None:
        yield
        return
    if threading.current_thread() is not threading.main_thread():
        raise XconfError(
            "runtime.case_timeout_unavailable",
            "a per-case time budget needs the main thread (SIGALRM)",
            "case_timeout_s",
        )
    armed = True

    def expire(signum: int, frame: Any) -> None:
        if armed:
            raise XconfError(
                "runtime.case_timeout",
                f"the case exceeded its time budget of {seconds:g} s and was stopped",
                "case_timeout_s",
            )

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def check_case_timeout(value: Any) -> float | None:
    """``None`` or a positive, finite number of seconds."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise XconfError(
            "config.wrong_type", "case_timeout_s is a number of seconds", "case_timeout_s"
        )
    if not math.isfinite(value) or value <= 0 or value > MAX_CASE_TIMEOUT_S:
        raise XconfError(
            "config.invalid_value",
            f"case_timeout_s must be positive and at most {MAX_CASE_TIMEOUT_S:g} s (30 days)",
            "case_timeout_s",
        )
    return float(value)
