"""`xconf-run -m`, one job: the composed config of one planned case turned into the run
service's inputs (the parent side is :mod:`xconf.sweep_service`, driven by the xconf sweeper).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace
from typing import Any

from omegaconf import DictConfig, OmegaConf

from xconf.session import RunOptions


def run_sweep_job(cfg: DictConfig) -> dict[str, Any]:
    """One multirun job = one case: the composed config's own knob values, nothing else.

    Raises on invalid input so the launcher reports the job as failed, never the sweep.
    """
    from xconf.launchers.rank import join_world

    # Under a multi-task Slurm job this joins the job's world; torchrun ranks already are in one.
    join_world()
    with _job_stop_signals():
        return _run_case(cfg)


def _job_stop_signals() -> AbstractContextManager[None]:
    """In a submitit job, scancel's SIGTERM and the time-limit SIGUSR2 stop the case without a
    verdict (the job ends without a result and the sweep records it as a failed job), instead
    of submitit's handlers raising an error the runner would seal as the case's verdict."""
    import os
    import signal

    from xconf.interrupts import stop_on_signals

    if "SUBMITIT_EXECUTOR" not in os.environ:
        return nullcontext()
    return stop_on_signals((signal.SIGTERM, signal.SIGUSR2))


def _run_case(cfg: DictConfig) -> dict[str, Any]:
    from xconf.config.hydra_document import experiment_document
    from xconf.config.strict import parse_experiment
    from xconf.sweep_service import run_case

    spec = parse_experiment(experiment_document(cfg), require_schema_version=False)
    spec = replace(spec, interventions=(), pairwise_paths=(), strategy="one_at_a_time")
    runtime = OmegaConf.to_container(cfg.runtime, resolve=True)
    return run_case(spec, runtime, RunOptions.from_config(cfg))
