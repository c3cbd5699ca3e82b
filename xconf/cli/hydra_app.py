"""`xconf-run`: the Hydra application. `xconf-run +experiment=cpu_smoke [mode=plan] [k=v ...]`.

Exit codes: 0 every case passed (or plan-only), 1 a non-pass verdict, 2 invalid input
(including a configuration Hydra itself could not compose).
"""

from __future__ import annotations

import sys
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

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
from xconf.runtime.deadline import check_case_timeout

_state: dict[str, Any] = {"started": False, "exit": EXIT_OK}


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
        return exit_code(summary.records)
    except XconfError as error:
        report_error(error)
        return EXIT_INVALID
    except OmegaConfBaseException as exc:  # e.g. an override with an unresolvable ${...}
        key = getattr(exc, "full_key", None)
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        report_error(ConfigError("config.unresolvable", message, str(key) if key else None))
        return EXIT_INVALID


@hydra.main(version_base="1.3", config_path=str(conf_dir()), config_name="config")
def _hydra_task(cfg: DictConfig) -> Any:
    _state["started"] = True
    hydra_cfg = HydraConfig.get()
    choice = hydra_cfg.runtime.choices.get("runtime")
    # The raw override strings: never resolve a ${...} they contain.
    raw = OmegaConf.to_container(hydra_cfg.overrides.task, resolve=False)
    overrides = [str(o) for o in raw] if isinstance(raw, list) else []
    code = run_from_config(cfg, overrides, choice)
    if hydra_cfg.mode == RunMode.RUN:
        _state["exit"] = code
    return code


def main() -> None:
    try:
        _hydra_task()
    except SystemExit as exc:
        # Hydra exits 1 when it cannot compose the config: that is invalid input.
        if not _state["started"] and exc.code not in (0, None):
            sys.exit(EXIT_INVALID)
        raise
    sys.exit(_state["exit"])


if __name__ == "__main__":
    main()
