"""Planning: knob normalization, one-at-a-time and pairwise expansion, the case cap, case ids.

Planning never constructs an engine. Every problem is reported as a PlanIssue; a plan with
issues raises PlanError carrying all of them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from itertools import product
from typing import Any

from xconf.canonical import canonical_digest
from xconf.config.strict import THRESHOLD_KEYS
from xconf.contract.loader import NumericalContract, load_contract
from xconf.errors import PlanError, PlanIssue
from xconf.experiment import Case, CaseKind, ExperimentPlan, ExperimentSpec, OperatorChoice
from xconf.knobs import (
    CONTRACT_KNOBS,
    DERIVED_KNOBS,
    KNOBS,
    LOGP_BACKEND,
    ROLLOUT_SCORING_MODE,
    KnobValue,
    KnobValueError,
    normalize_value,
)

MAX_CASES = 256  # fixed framework cap; not configurable


def case_id_for(
    knobs: dict[str, KnobValue], spec: ExperimentSpec, contract: NumericalContract
) -> str:
    """Stable: normalized requested values, identity, contract and scenario, nothing else."""
    operators = None
    if spec.operators is not None:
        operators = {
            side: None if choice is None else [choice.backend, [list(o) for o in choice.options]]
            for side, choice in (
                ("rollout", spec.operators.rollout),
                ("training", spec.operators.training),
            )
        }
    return case_id_from(
        knobs,
        operators=operators,
        identity_sha256=spec.identity.digest(),
        contract=(contract.version, contract.sha256),
        scenario=(spec.scenario_id, spec.scenario.to_dict()),
    )


def case_id_from(
    knobs: dict[str, KnobValue],
    *,
    operators: dict[str, Any] | None,
    identity_sha256: str,
    contract: tuple[str, str],
    scenario: tuple[str, dict[str, Any]],
) -> str:
    """:func:`case_id_for` from what a run directory records (experiment.json's identity
    digest, contract and scenario): a later step adds cases of the same experiment with the
    ids its plan would have given them."""
    digest = canonical_digest(
        {
            "knobs": knobs,
            "operators": operators,
            "identity": identity_sha256,
            "contract": list(contract),
            "scenario": [scenario[0], scenario[1]],
        }
    )
    return f"c-{digest[:16]}"


class _Issues:
    def __init__(self) -> None:
        self.items: list[PlanIssue] = []

    def add(self, code: str, path: str, message: str) -> None:
        self.items.append(PlanIssue(code, path, message))


def _check_path(path: str, where: str, issues: _Issues) -> bool:
    if any(part.strip().lower() in THRESHOLD_KEYS for part in path.split(".")):
        issues.add(
            "plan.threshold_forbidden",
            where,
            f"'{path}' names a threshold; thresholds come only from the numerical contract",
        )
        return False
    if path in DERIVED_KNOBS:
        issues.add("plan.derived_knob", where, f"'{path}' is derived and recorded, never set")
        return False
    if path not in KNOBS:
        issues.add("plan.unsupported_path", where, f"'{path}' is not an allow-listed knob")
        return False
    return True


def _wrong_type(kind: str, raw: object) -> bool:
    """True when ``raw`` is not even of the knob's type (bool is not an int, 1 is not a bool)."""
    if kind in ("positive_int", "positive_float", "nonnegative_float", "top_k", "probability"):
        return isinstance(raw, bool) or not isinstance(raw, int | float)
    if kind == "bool":
        return not isinstance(raw, bool)
    return not isinstance(raw, str)


def _normalize(path: str, raw: object, where: str, issues: _Issues) -> KnobValue | None:
    spec = KNOBS[path]
    try:
        return normalize_value(spec, raw)
    except KnobValueError as exc:
        code = "plan.wrong_value_type" if _wrong_type(spec.kind, raw) else "plan.unsupported_value"
        issues.add(code, where, str(exc))
        return None


def _normalize_baseline(spec: ExperimentSpec, issues: _Issues) -> dict[str, KnobValue]:
    baseline: dict[str, KnobValue] = {}
    for path, raw in spec.baseline:
        if not _check_path(path, f"baseline.{path}", issues):
            continue
        value = _normalize(path, raw, f"baseline.{path}", issues)
        if value is not None:
            baseline[path] = value
    # The contract's knobs are all declared; an extended knob only when a case changes it.
    required = set(CONTRACT_KNOBS) | {i.path for i in spec.interventions if i.path in KNOBS}
    for path in KNOBS:
        if path in required and path not in dict(spec.baseline):
            issues.add(
                "plan.missing_baseline_value",
                f"baseline.{path}",
                f"the baseline must declare '{path}'",
            )
    return baseline


def _check_scoring_mode(
    spec: ExperimentSpec, baseline: dict[str, KnobValue], issues: _Issues
) -> None:
    """The identity declares the baseline's rollout scoring mode; a baseline that declares
    ``rollout.scoring_mode`` too must say the same (an intervention may change it per case)."""
    mode = baseline.get(ROLLOUT_SCORING_MODE.path)
    if mode is not None and mode != spec.identity.scoring_mode:
        issues.add(
            "plan.scoring_mode_conflict",
            f"baseline.{ROLLOUT_SCORING_MODE.path}",
            f"the baseline declares {ROLLOUT_SCORING_MODE.path}={mode} but "
            f"identity.scoring_mode is {spec.identity.scoring_mode}: the identity declares the "
            "baseline's rollout mode; make them agree (an intervention scores its own case in "
            "the other mode)",
        )


def _normalize_interventions(
    spec: ExperimentSpec, baseline: dict[str, KnobValue], issues: _Issues
) -> dict[str, list[KnobValue]]:
    """path -> distinct normalized values that differ from the baseline, in declared order."""
    declared: dict[str, list[KnobValue]] = {}
    for i, intervention in enumerate(spec.interventions):
        where = f"interventions[{i}]"
        if not _check_path(intervention.path, f"{where}.path", issues):
            continue
        if intervention.path in declared:
            issues.add(
                "plan.duplicate_intervention",
                f"{where}.path",
                f"'{intervention.path}' is declared more than once",
            )
            continue
        if not intervention.values:
            issues.add(
                "plan.empty_intervention",
                f"{where}.values",
                f"'{intervention.path}' declares no values",
            )
            continue
        values: list[KnobValue] = []
        for j, raw in enumerate(intervention.values):
            value = _normalize(intervention.path, raw, f"{where}.values[{j}]", issues)
            if value is None:
                continue
            if value in values:
                issues.add(
                    "plan.duplicate_value",
                    f"{where}.values[{j}]",
                    f"value {raw!r} of '{intervention.path}' is declared twice",
                )
                continue
            values.append(value)
        declared[intervention.path] = [v for v in values if v != baseline.get(intervention.path)]
    if spec.operators is not None and LOGP_BACKEND.path in declared:
        issues.add(
            "plan.operator_mapping_conflict",
            "interventions.logp.backend",
            "a logp.backend intervention cannot change execution while operators.selected_logprob"
            " fixes an explicit mapping",
        )
    return declared


def _check_pairs(
    spec: ExperimentSpec, declared: dict[str, list[KnobValue]], issues: _Issues
) -> list[tuple[str, str]]:
    if spec.strategy != "pairwise":
        if spec.pairwise_paths:
            issues.add(
                "plan.pairwise_not_enabled",
                "pairwise_paths",
                "pairwise_paths are only used with strategy=pairwise",
            )
        return []
    if not spec.pairwise_paths:
        issues.add(
            "plan.pairwise_paths_required",
            "pairwise_paths",
            "strategy=pairwise needs explicitly listed path pairs",
        )
        return []
    pairs: list[tuple[str, str]] = []
    seen: set[frozenset[str]] = set()
    for i, (a, b) in enumerate(spec.pairwise_paths):
        where = f"pairwise_paths[{i}]"
        if a == b:
            issues.add("plan.invalid_pair", where, f"a pair needs two different paths, got '{a}'")
            continue
        undeclared = [p for p in (a, b) if p not in declared]
        if undeclared:
            issues.add(
                "plan.undeclared_pair_path",
                where,
                f"pair path(s) {undeclared} have no declared intervention",
            )
            continue
        key = frozenset((a, b))
        if key in seen:
            issues.add("plan.duplicate_pair", where, f"pair ({a}, {b}) is listed twice")
            continue
        seen.add(key)
        pairs.append((a, b))
    return pairs


def _expand(
    baseline: dict[str, KnobValue],
    declared: dict[str, list[KnobValue]],
    pairs: list[tuple[str, str]],
) -> Iterator[tuple[CaseKind, tuple[tuple[str, KnobValue], ...]]]:
    yield "baseline", ()
    for path, values in declared.items():
        for value in values:
            yield "one_at_a_time", ((path, value),)
    for a, b in pairs:
        for va, vb in product(declared[a], declared[b]):
            yield "pairwise", tuple(sorted(((a, va), (b, vb))))


def _normalize_operators(spec: ExperimentSpec, issues: _Issues) -> ExperimentSpec:
    """The explicit mapping's backend ids normalized as ``logp.backend`` values are (case,
    blanks, the reference project's aliases), before anything hashes them."""
    mapping = spec.operators
    if mapping is None:
        return spec
    sides: dict[str, OperatorChoice | None] = {}
    for side in ("rollout", "training"):
        choice = getattr(mapping, side)
        if choice is None:
            sides[side] = None
            continue
        try:
            backend = str(normalize_value(KNOBS[LOGP_BACKEND.path], choice.backend))
        except KnobValueError as exc:
            issues.add("plan.unsupported_value", f"operators.selected_logprob.{side}", str(exc))
            backend = choice.backend
        sides[side] = replace(choice, backend=backend)
    return replace(spec, operators=replace(mapping, **sides))


def plan_experiment(
    spec: ExperimentSpec, contract: NumericalContract | None = None
) -> ExperimentPlan:
    """Validate and expand ``spec``; raise PlanError with every issue found."""
    contract = contract or load_contract()
    issues = _Issues()
    spec = _normalize_operators(spec, issues)
    if spec.contract_version not in ("current", contract.version):
        issues.add(
            "plan.contract_version_mismatch",
            "contract_version",
            f"xconf ships contract {contract.version}, the experiment asks for "
            f"{spec.contract_version}",
        )
    baseline = _normalize_baseline(spec, issues)
    _check_scoring_mode(spec, baseline, issues)
    declared = _normalize_interventions(spec, baseline, issues)
    pairs = _check_pairs(spec, declared, issues)
    if issues.items:
        raise PlanError(tuple(issues.items))

    cases: list[Case] = []
    seen_ids: set[str] = set()
    for kind, changed in _expand(baseline, declared, pairs):
        # The cap is checked before the case is accumulated, so expansion stays bounded.
        if len(cases) >= MAX_CASES:
            raise PlanError(
                (
                    PlanIssue(
                        "plan.too_large",
                        "interventions",
                        f"the plan exceeds the fixed cap of {MAX_CASES} cases",
                    ),
                )
            )
        knobs = {**baseline, **dict(changed)}
        case_id = case_id_for(knobs, spec, contract)
        if case_id in seen_ids:
            continue
        seen_ids.add(case_id)
        cases.append(Case(case_id, len(cases), kind, changed, tuple(sorted(knobs.items()))))
    normalized = replace(spec, baseline=tuple(sorted(baseline.items())))
    return ExperimentPlan(normalized, tuple(cases), contract.version, contract.sha256)


def same_as_baseline(plan: ExperimentPlan) -> tuple[tuple[str, KnobValue], ...]:
    """Declared intervention values that equal the baseline once normalized (``fp32`` for a
    float32 baseline): they add no case, and the plan says so instead of dropping them."""
    baseline = dict(plan.spec.baseline)
    found: list[tuple[str, KnobValue]] = []
    for intervention in plan.spec.interventions:
        if intervention.path not in KNOBS:
            continue
        for raw in intervention.values:
            value = _normalize(intervention.path, raw, intervention.path, _Issues())
            same = value is not None and value == baseline.get(intervention.path)
            if same and (intervention.path, value) not in found:
                found.append((intervention.path, value))  # type: ignore[arg-type]
    return tuple(found)
