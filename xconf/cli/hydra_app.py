"""`xconf-run`: the Hydra application. `xconf-run +experiment=cpu_smoke [mode=plan] [k=v ...]`.

Exit codes: 0 every case passed (or plan-only), 1 a non-pass verdict, 2 invalid input
(including a configuration Hydra itself could not compose).
"""

from __future__ import annotations

import sys
from dataclasses import asdict, replace
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from xconf.cli.exit_status import mark_started, set_exit_code, state
from xconf.cli.render import case_progress, make_console, plan_table, print_reasons, verdict_table
from xconf.cli.session import (
    EXIT_INVALID,
    EXIT_OK,
    conf_dir,
    exit_code,
    instantiate_runtime,
    prepare,
    publish_plan,
    report_error,
    run_prepared,
)
from xconf.config.hydra_document import experiment_document, reject_config_set_cli_keys
from xconf.config.strict import parse_experiment
from xconf.errors import ConfigError, XconfError
from xconf.launchers.rank import join_world
from xconf.report.writer import report_after_run
from xconf.runtime.deadline import check_case_timeout


def run_from_config(cfg: DictConfig, overrides: list[str], runtime_choice: str | None) -> int:
    """Plan or run the experiment composed in ``cfg``; returns the exit code."""
    console = make_console()
    try:
        reject_config_set_cli_keys(cfg, overrides, runtime_choice)
        spec = parse_experiment(experiment_document(cfg), require_schema_version=False)
        output_root = hydra.utils.to_absolute_path(str(cfg.output_root))
        if cfg.mode == "plan":
            prepared = prepare(
                spec,
                output_root=output_root,
                allow_smoke_operators=True,
                device=spec.scenario.device,
            )
            publish_plan(prepared)
            console.print(plan_table(prepared.execution))
            console.print(f"wrote {prepared.store.path / 'plan.jsonl'}")
            return EXIT_OK
        runtime_cfg = OmegaConf.to_container(cfg.runtime, resolve=True)
        adapter = instantiate_runtime(runtime_cfg)  # type: ignore[arg-type]
        prepared = prepare(
            spec,
            output_root=output_root,
            allow_smoke_operators=bool(cfg.allow_smoke_operators),
            device=adapter.device,
        )
        with case_progress(console, len(prepared.execution.cases)) as on_case:
            summary = run_prepared(
                prepared,
                adapter,
                resume=bool(cfg.resume),
                on_case=on_case,
                case_timeout_s=check_case_timeout(cfg.get("case_timeout_s")),
            )
        console.print(verdict_table(summary))
        print_reasons(console, summary.records)
        console.print(f"artifacts: {summary.experiment_dir}")
        if cfg.get("localize"):
            from xconf.cli.localize import localize_failing

            localize_failing(summary, adapter, console)
        report_after_run(summary.experiment_dir, console)
        return exit_code(summary.records)
    except XconfError as error:
        report_error(error)
        return EXIT_INVALID
    except OmegaConfBaseException as exc:  # e.g. an override with an unresolvable ${...}
        key = getattr(exc, "full_key", None)
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        report_error(ConfigError("config.unresolvable", message, str(key) if key else None))
        return EXIT_INVALID


def run_sweep_job(cfg: DictConfig) -> dict[str, Any]:
    """One multirun job = one case: the composed config's own knob values, nothing else.

    Raises on invalid input so the launcher reports the job as failed, never the sweep.
    """
    # Under a multi-task Slurm job this joins the job's world; torchrun ranks already are in one.
    join_world()
    spec = parse_experiment(experiment_document(cfg), require_schema_version=False)
    spec = replace(spec, interventions=(), pairwise_paths=(), strategy="one_at_a_time")
    adapter = instantiate_runtime(OmegaConf.to_container(cfg.runtime, resolve=True))  # type: ignore[arg-type]
    prepared = prepare(
        spec,
        output_root=hydra.utils.to_absolute_path(str(cfg.output_root)),
        allow_smoke_operators=bool(cfg.allow_smoke_operators),
        device=adapter.device,
    )
    summary = run_prepared(
        prepared,
        adapter,
        resume=bool(cfg.resume),
        case_timeout_s=check_case_timeout(cfg.get("case_timeout_s")),
    )
    record = summary.records[0]
    return {
        **asdict(record),
        "engines_built": summary.engines_built,
        "engines_reused": summary.engines_reused,
    }


@hydra.main(version_base="1.3", config_path=str(conf_dir()), config_name="config")
def _hydra_task(cfg: DictConfig) -> Any:
    mark_started()
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode == RunMode.MULTIRUN:
        return run_sweep_job(cfg)
    choice = hydra_cfg.runtime.choices.get("runtime")
    # The raw override strings: never resolve a ${...} they contain.
    raw = OmegaConf.to_container(hydra_cfg.overrides.task, resolve=False)
    overrides = [str(o) for o in raw] if isinstance(raw, list) else []
    code = run_from_config(cfg, overrides, choice)
    set_exit_code(code)
    return code


def main() -> None:
    try:
        _hydra_task()
    except SystemExit as exc:
        # Hydra exits 1 when it cannot compose the config: that is invalid input.
        if not state["started"] and exc.code not in (0, None):
            sys.exit(EXIT_INVALID)
        raise
    sys.exit(int(state["exit"]))


if __name__ == "__main__":
    main()
