"""The fix search's cases as ordinary cases of the run's own experiment.

A run directory does not hold the experiment document it was planned from, but it holds what
a case id is a digest of (``planner.case_id_from``): every case's knobs (plan.jsonl),
the declared identity's digest, the contract and the scenario (experiment.json). A fix case
is the failing case's knobs plus an arm's, with the id the run's own plan would have given
it (checked by computing the failing case's own id the same way first); its row is sealed as
a plan extension (``store.extend_plan``) before it runs, and the paired runner scores it on
the sealed frozen identity, so it seals, resumes and verifies as every other case does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from xconf.artifacts.layout import HEADER_NAME, read_json
from xconf.case_record import CaseRecord
from xconf.contract.loader import load_contract
from xconf.execution_plan import ExecutionPlan, build_execution_plan
from xconf.experiment import Case, ExperimentPlan, ExperimentSpec, Scenario
from xconf.fix.errors import FixError
from xconf.fix.ladder import Step
from xconf.knobs import KNOBS, KnobValue, normalize_value
from xconf.localize.inputs import RunInputs
from xconf.operators.catalog import ResolutionPolicy
from xconf.planner import case_id_from


@dataclass(frozen=True)
class FixPlan:
    """What every fix case of one run shares: read from the run directory once."""

    inputs: RunInputs  # the failing case, the baseline, the sealed frozen identity, the runtime
    header: Mapping[str, Any]
    strict: bool
    next_index: int

    def case_id(self, knobs: Mapping[str, KnobValue]) -> str:
        contract = self.header["contract"]
        return case_id_from(
            dict(knobs),
            operators=None,
            identity_sha256=str(self.header["identity_sha256"]),
            contract=(str(contract["version"]), str(contract["sha256"])),
            scenario=(str(self.header["scenario_id"]), dict(self.header["scenario"])),
        )

    def spec(self, knobs: Mapping[str, KnobValue]) -> ExperimentSpec:
        """The experiment as the runner needs it for one fix case: its knobs as the baseline
        (as one job of a sweep plans its case) and the *sealed frozen* identity, which the
        runner scores and records; the case's id comes from :meth:`case_id`."""
        scenario = dict(self.header["scenario"])
        contract = self.header["contract"]
        return ExperimentSpec(
            experiment_id=self.inputs.store.experiment_id,
            scenario_id=str(self.header["scenario_id"]),
            contract_source=str(contract.get("source", "xconf")),
            contract_version=str(contract["version"]),
            strategy="one_at_a_time",
            strict_fallback=self.strict,
            identity=self.inputs.identity,
            baseline=tuple(sorted(knobs.items())),
            interventions=(),
            pairwise_paths=(),
            operators=None,
            scenario=Scenario(
                level=str(scenario.pop("level")),
                device=str(scenario.pop("device")),
                fields=tuple(sorted(scenario.items())),
            ),
        )


def fix_plan(inputs: RunInputs, rows: Mapping[str, Mapping[str, Any]]) -> FixPlan:
    """The run's header and the failing case's id re-derived from it (``fix.foreign_plan``
    when it cannot be: an explicit operator mapping, or a plan another xconf wrote)."""
    header = read_json(inputs.store.path / HEADER_NAME)
    requested = read_json(inputs.attempt_path / "requested.json")
    if not isinstance(header, dict) or not isinstance(requested, dict):
        raise FixError("fix.bad_run", "experiment.json or requested.json is not an object")
    plan = FixPlan(
        inputs,
        header,
        bool(requested.get("strict_execution", True)),
        max((int(r.get("index", 0)) for r in rows.values()), default=0) + 1,
    )
    try:
        derived = plan.case_id(inputs.case.knob_dict())
    except (KeyError, TypeError, ValueError) as exc:
        raise FixError(
            "fix.foreign_plan", f"experiment.json lacks {exc}", str(inputs.store.path)
        ) from exc
    if derived != inputs.case.case_id:
        raise FixError(
            "fix.foreign_plan",
            f"case {inputs.case.case_id}'s id is not the digest of its knobs, identity, "
            "contract and scenario without an operator mapping: the fix search adds cases "
            "only to runs whose selected-logprob backends follow logp.backend",
            "operators",
        )
    return plan


def fix_case_row(plan: FixPlan, step: Step, number: int) -> tuple[Case, dict[str, Any]]:
    """The search's ``number``-th step (from 0) as a case of the run: its knobs (the failing
    case's plus the step's), what it changes from the run's baseline, its id, its plan row."""
    knobs = plan.inputs.case.knob_dict()
    for path, value in step.knobs:
        knobs[path] = normalize_value(KNOBS[path], value)
    base = plan.inputs.baseline.knob_dict()
    changed = {p: v for p, v in sorted(knobs.items()) if base.get(p) != v}
    case = Case(
        case_id=plan.case_id(knobs),
        index=plan.next_index + number,
        kind="fix",
        changed=tuple(changed.items()),
        knobs=tuple(sorted(knobs.items())),
    )
    row = {
        "case_id": case.case_id,
        "index": case.index,
        "kind": case.kind,
        "changed": changed,
        "knobs": dict(case.knobs),
    }
    return case, row


def execution(plan: FixPlan, case: Case, catalog: Any, device: str) -> ExecutionPlan:
    """The one-case execution plan the runner takes (its operators bound from the catalog
    as the run's plan bound them: by ``logp.backend``)."""
    spec = plan.spec(dict(case.knobs))
    contract = load_contract()
    experiment = ExperimentPlan(spec, (case,), contract.version, contract.sha256)
    return build_execution_plan(experiment, catalog, _policy(device))


def _policy(device: str) -> ResolutionPolicy:
    return ResolutionPolicy(allow_smoke_operators=False, device=device)


def run_case(
    plan: FixPlan,
    case: Case,
    row: dict[str, Any],
    adapter: Any,
    catalog: Any,
) -> CaseRecord:
    """Seal the case's plan row, then score, judge and seal it (resume reuses a sealed one).

    Each case gets a runner of its own, whose engines are closed when it ends: a case is
    bound (its process context read) with no engine of an earlier case alive, as every case
    of a run is bound before the run builds one, so its execution key is the one a resume
    derives again."""
    from xconf.runner import PairedRunner

    bound = execution(plan, case, catalog, adapter.device)
    policy = _policy(adapter.device)
    row = {**row, "operators": bound.cases[0].to_row()["operators"]}
    plan.inputs.store.extend_plan([row])
    runner = PairedRunner(bound, adapter, plan.inputs.store, catalog, policy, resume=True)
    summary = runner.run({case.case_id}, identity=plan.inputs.identity)
    return summary.records[0]
