"""Process exit status of `xconf-run`, shared by the single-run task and the sweeper.

A separate module so the state is one object even when the app runs as ``python -m``.
"""

from __future__ import annotations

state: dict[str, int | bool] = {"started": False, "exit": 0}


def set_exit_code(code: int) -> None:
    """Record the verdict (0 all pass or plan-only, 1 any non-pass, 2 invalid input)."""
    state["exit"] = code
    state["started"] = True


def mark_started() -> None:
    state["started"] = True
