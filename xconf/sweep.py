"""Sweep planning for Hydra multirun: shell sweeps become interventions, cases become jobs.

``xconf-run -m +experiment=x rollout.dtype=bfloat16,float32 batch.size=1,8`` declares two
interventions (one knob at a time), never a Cartesian product. Each planned case becomes one
Hydra job whose overrides are the shared (non-sweep) overrides plus that case's changed knobs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from xconf.config.hydra_document import experiment_document
from xconf.config.strict import parse_experiment, reject_threshold_keys
from xconf.errors import ConfigError
from xconf.knobs import KNOBS, KnobValue
from xconf.session import Prepared, prepare


@dataclass(frozen=True)
class SweepOverrides:
    """The shell's overrides split into shared ones and declared interventions."""

    shared: tuple[str, ...]
    interventions: tuple[tuple[str, tuple[Any, ...]], ...]


@dataclass(frozen=True)
class SweepJob:
    case_id: str
    label: str
    overrides: tuple[str, ...]


def format_value(value: KnobValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def split_overrides(parsed: Sequence[Any]) -> SweepOverrides:
    """Hydra ``Override`` objects -> shared overrides and (knob path, values) interventions."""
    shared: list[str] = []
    interventions: list[tuple[str, tuple[Any, ...]]] = []
    for override in parsed:
        key = override.get_key_element()
        reject_threshold_keys({key.lstrip("+~"): None})
        if not override.is_sweep_override():
            shared.append(override.input_line)
            continue
        path = key.lstrip("+~")
        if not override.is_discrete_sweep():
            raise ConfigError(
                "sweep.unsupported_sweep",
                "xconf sweeps declare discrete values (a,b,c or choice(...))",
                path,
            )
        if path not in KNOBS:
            raise ConfigError(
                "sweep.not_a_knob",
                f"only allow-listed knobs can be swept; '{path}' is not one "
                f"({', '.join(sorted(KNOBS))})",
                path,
            )
        interventions.append((path, tuple(override.sweep_iterator())))
    return SweepOverrides(tuple(shared), tuple(interventions))


def merged_document(cfg: DictConfig, sweep: SweepOverrides) -> tuple[dict[str, Any], list[str]]:
    """The experiment document with shell interventions merged into the declared ones.

    A path declared by both keeps the experiment's values and adds the shell's new ones; a value
    declared by both is reported (second element) and kept once.
    """
    document = experiment_document(cfg)
    declared = [dict(item) for item in document.get("interventions") or []]
    by_path = {item.get("path"): item for item in declared}
    notices = []
    for path, values in sweep.interventions:
        if path not in by_path:
            declared.append({"path": path, "values": list(values)})
            by_path[path] = declared[-1]
            continue
        existing = list(by_path[path].get("values") or [])
        for value in values:
            if value in existing:
                notices.append(f"{path}={value} is declared by the experiment and the shell")
            else:
                existing.append(value)
        by_path[path]["values"] = existing
    document["interventions"] = declared
    return document, notices


def plan_sweep(
    cfg: DictConfig, sweep: SweepOverrides, *, output_root: str
) -> tuple[Prepared, list[SweepJob], list[str]]:
    """Plan the whole sweep (cap and every check before any job starts) and derive its jobs."""
    document, notices = merged_document(cfg, sweep)
    spec = parse_experiment(document, require_schema_version=False)
    # Planning only binds descriptors; smoke authorization is enforced when a job runs.
    plan_only = cfg.get("mode") == "plan"
    allow_smoke = plan_only or bool(cfg.get("allow_smoke_operators", False))
    prepared = prepare(
        spec,
        output_root=output_root,
        allow_smoke_operators=allow_smoke,
        device=spec.scenario.device,
        runtime=cfg.get("runtime"),
    )
    jobs = []
    for case in prepared.execution.cases:
        changed = [f"{path}={format_value(value)}" for path, value in case.case.changed]
        jobs.append(SweepJob(case.case.case_id, case.case.label(), (*sweep.shared, *changed)))
    return prepared, jobs, notices
