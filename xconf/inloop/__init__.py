"""Judging inside the training loop: :func:`judge_batch`, :class:`StepJudge`, loggers.

Names are loaded on first use, so ``import xconf.inloop`` costs nothing until called.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "BatchVerdict": "xconf.inloop.api",
    "InloopError": "xconf.inloop.api",
    "figures": "xconf.inloop.api",
    "judge_batch": "xconf.inloop.api",
    "StepJudge": "xconf.inloop.steps",
    "seal_step": "xconf.inloop.steps",
}
__all__ = [
    "BatchVerdict",
    "InloopError",
    "StepJudge",
    "figures",
    "judge_batch",
    "seal_step",
]

if TYPE_CHECKING:
    from xconf.inloop.api import BatchVerdict, InloopError, figures, judge_batch
    from xconf.inloop.steps import StepJudge, seal_step


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'xconf.inloop' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
