"""Composition root shared by `xconf` and `xconf-run`: plan, bind operators, run, publish."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from omegaconf import DictConfig

from xconf.artifacts.store import ExperimentStore
from xconf.errors import ConfigError, XconfError
from xconf.execution_plan import ExecutionPlan, build_execution_plan
from xconf.planner import plan_experiment
from xconf.runner import CaseRecord, PairedRunner, RunSummary
from xconf.runtime.loading import instantiate_runtime as instantiate_runtime
from xconf.runtime.loading import load_runtime_config
from xconf.schema import PLAN_SCHEMA, ExperimentSpec
from xconf.semantic_registry import ResolutionPolicy, SemanticOperatorCatalog

Mode = Literal["plan", "run"]
EXIT_OK, EXIT_NON_PASS, EXIT_INVALID = 0, 1, 2


def conf_dir() -> Path:
    """The Hydra config tree: the repository's conf/ (editable install) or the wheel's copy."""
    package = Path(__file__).resolve().parent.parent
    for candidate in (package.parent / "conf", package / "_conf"):
        if (candidate / "config.yaml").is_file():
            return candidate
    raise ConfigError("config.no_conf_dir", "cannot find xconf's conf/ tree", str(package))


def runtime_config(name: str, overrides: Sequence[str] = ()) -> DictConfig:
    """``conf/runtime/<name>.yaml`` with the command line's ``runtime.*`` overrides."""
    return load_runtime_config(conf_dir(), name, overrides)


def make_catalog(allow_smoke_operators: bool) -> SemanticOperatorCatalog:
    catalog = SemanticOperatorCatalog.from_entry_points()
    if allow_smoke_operators:
        from xconf.testing.smoke_ops import register_smoke_operators

        register_smoke_operators(catalog)
    return catalog


@dataclass(frozen=True)
class Prepared:
    execution: ExecutionPlan
    store: ExperimentStore
    policy: ResolutionPolicy
    catalog: SemanticOperatorCatalog


def plan_header(execution: ExecutionPlan) -> dict[str, Any]:
    plan = execution.plan
    spec = plan.spec
    return {
        "schema": PLAN_SCHEMA,
        "experiment_id": spec.experiment_id,
        "scenario_id": spec.scenario_id,
        "scenario": spec.scenario.to_dict(),
        "identity_sha256": spec.identity.digest(),
        "contract": {
            "version": plan.contract_version,
            "sha256": plan.contract_sha256,
            "source": spec.contract_source,
        },
    }


def prepare(
    spec: ExperimentSpec, *, output_root: str | Path, allow_smoke_operators: bool, device: str
) -> Prepared:
    """Plan and bind operators; raises before anything is written when input is invalid."""
    plan = plan_experiment(spec)
    policy = ResolutionPolicy(allow_smoke_operators=allow_smoke_operators, device=device)
    catalog = make_catalog(allow_smoke_operators)
    execution = build_execution_plan(plan, catalog, policy)
    store = ExperimentStore(output_root, spec.experiment_id)
    return Prepared(execution, store, policy, catalog)


def publish_plan(prepared: Prepared) -> None:
    rows = [case.to_row() for case in prepared.execution.cases]
    prepared.store.publish_plan(plan_header(prepared.execution), rows)


def run_prepared(
    prepared: Prepared,
    adapter: Any,
    *,
    resume: bool,
    on_case: Any = None,
    case_ids: set[str] | None = None,
    case_timeout_s: float | None = None,
) -> RunSummary:
    scenario_device = prepared.execution.plan.spec.scenario.device
    if scenario_device != adapter.device:
        raise ConfigError(
            "runtime.device_mismatch",
            f"runtime '{adapter.runtime_kind}' runs on {adapter.device}, the scenario declares "
            f"{scenario_device}; plan it with mode=plan or choose a {scenario_device} runtime",
            "scenario.device",
        )
    publish_plan(prepared)
    runner = PairedRunner(
        prepared.execution,
        adapter,
        prepared.store,
        prepared.catalog,
        prepared.policy,
        resume=resume,
        on_case=on_case,
        case_timeout_s=case_timeout_s,
    )
    try:
        return runner.run(case_ids)
    finally:
        adapter.close()


def exit_code(records: list[CaseRecord]) -> int:
    return EXIT_OK if all(r.result == "pass" for r in records) else EXIT_NON_PASS


def report_error(error: XconfError) -> None:
    where = f" at '{error.path}'" if error.path else ""
    print(f"xconf: error [{error.code}]{where}: {error.message}", file=sys.stderr)
    for issue in getattr(error, "issues", ())[1:]:
        print(f"xconf: error [{issue.code}] at '{issue.path}': {issue.message}", file=sys.stderr)
