"""The sweep service behind `xconf-run -m`: a planned sweep through a Hydra launcher, one
verdict per case.

The parent side (:func:`run_sweep`, called by the xconf sweeper with the view its task
function gives it) plans every case before any job starts, launches the jobs in batches and
gathers their verdicts; the job side (:func:`run_case`, called by the multirun front end
``cli/multirun_job.py``) runs one case silently. Both go through :mod:`xconf.session`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import hydra
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import DictConfig, OmegaConf, open_dict

from xconf import session
from xconf.session import EXIT_OK, Outcome, RunOptions, View


@dataclass(frozen=True)
class SweepResult:
    outcome: Outcome
    returns: list[Sequence[JobReturn]] = field(default_factory=list)


def _task_config(full: DictConfig) -> tuple[DictConfig, str | None]:
    choice = full.hydra.runtime.choices.get("runtime") if "hydra" in full else None
    task = OmegaConf.create(OmegaConf.to_container(full, resolve=False))
    if not isinstance(task, DictConfig):
        raise TypeError("the composed sweep config is not a mapping")
    with open_dict(task):
        task.pop("hydra", None)
    return task, choice


def _record(job: Any, ret: JobReturn) -> Any:
    from xconf.case_record import CaseRecord

    if ret.status == JobStatus.COMPLETED and isinstance(ret.return_value, dict):
        return CaseRecord.from_json(ret.return_value, label=job.label)
    reason = (
        _failure(ret._return_value)
        if ret.status == JobStatus.FAILED
        else ("job returned no verdict")
    )
    return CaseRecord(
        job.case_id, job.label, "error", "-", "error", False, 0, 0, None, None, reason
    )


def _failure(value: Any) -> str:
    from xconf.errors import XconfError

    if isinstance(value, XconfError):  # a coded launch error: say its code, not its repr
        return f"job failed ({value.code}): {value.message}"
    return f"job failed: {value!r}"


def run_sweep(
    *,
    overrides: Sequence[Any],
    load_config: Callable[[Sequence[str]], DictConfig],
    launch: Callable[[list[list[str]], int], Sequence[JobReturn]],
    max_batch_size: int | None,
    save_multirun: Callable[[], None],
    view: View,
) -> SweepResult:
    """Plan everything (cap included) before launching; a failed job is a failed case."""
    from xconf.config.hydra_document import reject_config_set_cli_keys
    from xconf.sweep import plan_sweep, split_overrides

    planned: dict[str, Any] = {}  # what plan_step found, for the launch below

    def plan_step() -> Outcome:
        split = split_overrides(overrides)
        cfg, runtime_choice = _task_config(load_config(split.shared))
        reject_config_set_cli_keys(cfg, list(split.shared), runtime_choice)
        output_root = hydra.utils.to_absolute_path(str(cfg.output_root))
        prepared, jobs, notices = plan_sweep(cfg, split, output_root=output_root)
        session.publish_plan(prepared)
        planned.update(cfg=cfg, jobs=jobs, notices=notices)
        return Outcome(EXIT_OK, prepared=prepared)

    outcome = session.guarded(plan_step)
    if outcome.prepared is None:
        return SweepResult(outcome)
    prepared = outcome.prepared
    for notice in planned["notices"]:
        from rich.text import Text

        view.console.print(Text.assemble(("duplicate intervention reported: ", "yellow"), notice))
    save_multirun()
    if planned["cfg"].mode == "plan":
        view.planned(prepared, "; launched nothing")
        return SweepResult(outcome)
    from xconf.case_record import RunSummary

    jobs = planned["jobs"]
    batch_size = max_batch_size or len(jobs)
    returns: list[Sequence[JobReturn]] = []
    summary = RunSummary(prepared.store.experiment_id, str(prepared.store.path))

    def launch_step() -> Outcome:
        for start in range(0, len(jobs), batch_size):
            batch = jobs[start : start + batch_size]
            results = launch([list(j.overrides) for j in batch], start)
            returns.append(results)
            for job, ret in zip(batch, results, strict=True):
                summary.records.append(_record(job, ret))
                if ret.status == JobStatus.COMPLETED and isinstance(ret.return_value, dict):
                    summary.engines_built += int(ret.return_value.get("engines_built", 0))
                    summary.engines_reused += int(ret.return_value.get("engines_reused", 0))
        return session.conclude(summary, view, prepared)

    # A SIGINT/SIGTERM stops launching: the batch in flight is ended and records nothing.
    return SweepResult(session.guarded(launch_step), returns)


def run_case(spec: Any, runtime: Any, options: RunOptions) -> dict[str, Any]:
    """One multirun job = one case, run silently; its record (and engine counts) is what the
    job returns to the sweep's parent."""
    outcome = session.run(spec, runtime, options, view=None)
    summary = outcome.summary
    if summary is None:  # session.run always returns its summary; a type guard only
        raise RuntimeError("a sweep job ended without a summary")
    return {
        **summary.records[0].to_json(),
        "engines_built": summary.engines_built,
        "engines_reused": summary.engines_reused,
    }
