"""xconf: find which configuration change makes rollout logprobs drift from training.

The package root exports only the planning and execution facade. Its names are loaded on
first use (PEP 562), so `import xconf.<anything>` never pays for torch: `xconf --help` and
`xconf plan` import no tensor library.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "PairedRunner": "xconf.runner",
    "RunSummary": "xconf.case_record",
    "build_execution_plan": "xconf.execution_plan",
    # Judging inside a training loop (xconf/inloop): the one call a training step makes.
    "judge_batch": "xconf.inloop.api",
    "load_experiment_file": "xconf.config.strict",
    "parse_experiment": "xconf.config.strict",
    "plan_experiment": "xconf.planner",
}

__all__ = [
    "PairedRunner",
    "RunSummary",
    "build_execution_plan",
    "judge_batch",
    "load_experiment_file",
    "parse_experiment",
    "plan_experiment",
]

if TYPE_CHECKING:
    from xconf.case_record import RunSummary
    from xconf.config.strict import load_experiment_file, parse_experiment
    from xconf.execution_plan import build_execution_plan
    from xconf.inloop.api import judge_batch
    from xconf.planner import plan_experiment
    from xconf.runner import PairedRunner


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'xconf' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
