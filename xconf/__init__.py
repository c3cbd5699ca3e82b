"""xconf: find which configuration change makes rollout logprobs drift from training.

The package root exports only the planning and execution facade.
"""

from xconf.config.strict import load_experiment_file, parse_experiment
from xconf.execution_plan import build_execution_plan
from xconf.planner import plan_experiment
from xconf.runner import PairedRunner, RunSummary

__all__ = [
    "PairedRunner",
    "RunSummary",
    "build_execution_plan",
    "load_experiment_file",
    "parse_experiment",
    "plan_experiment",
]
