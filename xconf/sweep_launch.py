"""Drives a planned sweep through a Hydra launcher and gathers one verdict per case."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import hydra
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import DictConfig, OmegaConf, open_dict
from rich.text import Text

from xconf.cli.exit_status import set_exit_code
from xconf.cli.render import make_console, plan_table, print_reasons, verdict_table
from xconf.cli.session import EXIT_INVALID, EXIT_OK, exit_code, publish_plan, report_error
from xconf.config.hydra_document import reject_config_set_cli_keys
from xconf.errors import XconfError
from xconf.report.writer import report_after_run
from xconf.runner import CaseRecord, RunSummary
from xconf.sweep import SweepJob, plan_sweep, split_overrides


def _task_config(full: DictConfig) -> tuple[DictConfig, str | None]:
    choice = full.hydra.runtime.choices.get("runtime") if "hydra" in full else None
    task = OmegaConf.create(OmegaConf.to_container(full, resolve=False))
    if not isinstance(task, DictConfig):
        raise TypeError("the composed sweep config is not a mapping")
    with open_dict(task):
        task.pop("hydra", None)
    return task, choice


def _record(job: SweepJob, ret: JobReturn) -> CaseRecord:
    if ret.status == JobStatus.COMPLETED and isinstance(ret.return_value, dict):
        values = {k: v for k, v in ret.return_value.items() if k in CaseRecord.__dataclass_fields__}
        return CaseRecord(**{**values, "label": job.label})
    reason = (
        f"job failed: {ret._return_value!r}"
        if ret.status == JobStatus.FAILED
        else ("job returned no verdict")
    )
    return CaseRecord(
        job.case_id, job.label, "error", "-", "error", False, 0, 0, None, None, reason
    )


def run_sweep(
    *,
    overrides: Sequence[Any],
    load_config: Callable[[Sequence[str]], DictConfig],
    launch: Callable[[list[list[str]], int], Sequence[JobReturn]],
    max_batch_size: int | None,
    save_multirun: Callable[[], None],
) -> list[Sequence[JobReturn]]:
    """Plan everything (cap included) before launching; a failed job is a failed case."""
    console = make_console()
    try:
        split = split_overrides(overrides)
        cfg, runtime_choice = _task_config(load_config(split.shared))
        reject_config_set_cli_keys(cfg, list(split.shared), runtime_choice)
        output_root = hydra.utils.to_absolute_path(str(cfg.output_root))
        prepared, jobs, notices = plan_sweep(cfg, split, output_root=output_root)
        publish_plan(prepared)
    except XconfError as error:
        report_error(error)
        set_exit_code(EXIT_INVALID)
        return []
    for notice in notices:
        console.print(Text.assemble(("duplicate intervention reported: ", "yellow"), notice))
    save_multirun()
    if cfg.mode == "plan":
        console.print(plan_table(prepared.execution))
        console.print(f"wrote {prepared.store.path / 'plan.jsonl'}; launched nothing")
        set_exit_code(EXIT_OK)
        return []
    batch_size = max_batch_size or len(jobs)
    returns: list[Sequence[JobReturn]] = []
    summary = RunSummary(prepared.store.experiment_id, str(prepared.store.path))
    for start in range(0, len(jobs), batch_size):
        batch = jobs[start : start + batch_size]
        results = launch([list(j.overrides) for j in batch], start)
        returns.append(results)
        for job, ret in zip(batch, results, strict=True):
            summary.records.append(_record(job, ret))
            if ret.status == JobStatus.COMPLETED and isinstance(ret.return_value, dict):
                summary.engines_built += int(ret.return_value.get("engines_built", 0))
                summary.engines_reused += int(ret.return_value.get("engines_reused", 0))
    console.print(verdict_table(summary))
    print_reasons(console, summary.records)
    console.print(f"artifacts: {summary.experiment_dir}")
    report_after_run(summary.experiment_dir, console)
    set_exit_code(exit_code(summary.records))
    return returns
