"""Binds each planned case to its rollout and training selected-logprob operators."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from xconf.canonical import canonical_digest
from xconf.errors import OperatorResolutionError, PlanError, PlanIssue
from xconf.experiment import Case, ExperimentPlan, OperatorChoice
from xconf.knobs import LOGP_BACKEND, side_dtype
from xconf.operators.catalog import (
    SELECTED_LOGPROB,
    SIDES,
    OperatorBinding,
    OperatorDescriptor,
    ResolutionPolicy,
    SemanticOperatorCatalog,
    Side,
    check_descriptor,
    load_object,
)


@dataclass(frozen=True)
class ExecutionCase:
    """An immutable case with its operator bindings: what a runtime adapter receives."""

    case: Case
    operators: tuple[OperatorBinding, OperatorBinding]  # (rollout, training)

    def operator(self, side: Side) -> OperatorBinding:
        return self.operators[SIDES.index(side)]

    def binding_digest(self) -> str:
        return canonical_digest([b.to_dict() for b in self.operators])

    def to_row(self) -> dict[str, Any]:
        """The canonical row shared by plan.jsonl and execution."""
        return {
            "case_id": self.case.case_id,
            "index": self.case.index,
            "kind": self.case.kind,
            "changed": dict(self.case.changed),
            "knobs": self.case.knob_dict(),
            "operators": {b.side: b.backend_id for b in self.operators},
        }


@dataclass(frozen=True)
class ExecutionPlan:
    plan: ExperimentPlan
    cases: tuple[ExecutionCase, ...]


def _choice_for(plan: ExperimentPlan, case: Case, side: Side) -> tuple[OperatorChoice, str]:
    mapping = plan.spec.operators
    explicit = None if mapping is None else getattr(mapping, side)
    if explicit is not None:
        return explicit, f"operators.{SELECTED_LOGPROB}.{side}"
    return OperatorChoice(str(case.knob_dict()[LOGP_BACKEND.path])), LOGP_BACKEND.path


def option_problem(
    descriptor: OperatorDescriptor, choice: OperatorChoice, path: str
) -> tuple[str, str] | None:
    """(path, why) when the operator's factory does not take ``choice``'s options: checked
    against its signature at plan time, never discovered when a case instantiates it.

    The factory is imported only when there are options to check (a plan stays torch-free).
    """
    if not choice.options:
        return None
    first = f"{path}.options.{choice.options[0][0]}"
    if descriptor.runtime_native:
        return first, f"backend '{descriptor.backend_id}' is the runtime's own path: no options"
    try:
        factory = load_object(descriptor.factory)
        params = inspect.signature(factory).parameters.values()
    except (ImportError, TypeError, ValueError) as exc:
        return first, f"cannot read the options of '{descriptor.factory}': {exc}"
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    # ``side`` is the session's to pass (factory_takes_side), never an option.
    names = {p.name for p in params if p.kind is not inspect.Parameter.VAR_POSITIONAL} - {"side"}
    unknown = [k for k, _ in choice.options if k not in names]
    if unknown:
        takes = ", ".join(sorted(names)) or "no options"
        return (
            f"{path}.options.{unknown[0]}",
            f"backend '{descriptor.backend_id}' takes {takes}; unknown option(s) {unknown}",
        )
    return None


def build_execution_plan(
    plan: ExperimentPlan, catalog: SemanticOperatorCatalog, policy: ResolutionPolicy
) -> ExecutionPlan:
    """Strictly resolve every case's operator descriptors; report all failures as issues."""
    issues: list[PlanIssue] = []
    cases: list[ExecutionCase] = []
    for case in plan.cases:
        bindings: list[OperatorBinding] = []
        knobs = case.knob_dict()
        for side in SIDES:
            choice, path = _choice_for(plan, case, side)
            try:
                descriptor = check_descriptor(
                    catalog.get(SELECTED_LOGPROB, choice.backend),
                    side=side,
                    backend_id=choice.backend,
                    dtype=side_dtype(knobs, side),
                    knobs=knobs,
                    policy=policy,
                    path=path,
                )
            except OperatorResolutionError as exc:
                issues.append(
                    PlanIssue(exc.code, path, f"case {case.label()}, {side} side: {exc.message}")
                )
                continue
            problem = option_problem(descriptor, choice, path)
            if problem is not None:
                issues.append(PlanIssue("operator.unknown_option", problem[0], problem[1]))
                continue
            bindings.append(
                OperatorBinding(
                    semantic_operation=SELECTED_LOGPROB,
                    side=side,
                    backend_id=descriptor.backend_id,
                    options=choice.options,
                    descriptor_fingerprint=descriptor.fingerprint(),
                    is_smoke_only=descriptor.is_smoke_only,
                    runtime_native=descriptor.runtime_native,
                )
            )
        if len(bindings) == len(SIDES):
            cases.append(ExecutionCase(case, (bindings[0], bindings[1])))
    if issues:
        raise PlanError(tuple(issues))
    return ExecutionPlan(plan, tuple(cases))
