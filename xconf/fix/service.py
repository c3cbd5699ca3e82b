"""``fix_case``: the fix search of one failing case, from run directory to sealed record;
``after_verdict``: that, for a failing baseline, as the hook ``fix=true`` hands the run service.

The front ends only parse arguments and draw results (``xconf/cli/fix.py``); the run service
never imports this module.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xconf.artifacts.fix_record import DOCUMENT_NAME, FIX_DIR, FIX_SCHEMA, SEAL_SCHEMA
from xconf.artifacts.layout import read_json
from xconf.artifacts.localization import latest as latest_localization
from xconf.artifacts.plan_seal import sealed_rows
from xconf.artifacts.safe_io import real_dir
from xconf.artifacts.store import json_bytes, publish_sealed
from xconf.errors import XconfError
from xconf.fix.cases import FixPlan, execution, fix_case_row, fix_plan, run_case
from xconf.fix.errors import FixError
from xconf.fix.evidence import StepEvidence, step_evidence
from xconf.fix.ladder import Step, start_kind, steps
from xconf.knobs import ALIGN_KINDS, TRAINING_SCORING_MODE
from xconf.run_output import OutputPolicy, third_party_output


@dataclass(frozen=True)
class StepOutcome:
    step: Step
    case_id: str
    attempt_id: str
    evidence: StepEvidence

    def to_dict(self) -> dict[str, Any]:
        e = self.evidence
        return {
            "case_id": self.case_id,
            "attempt_id": self.attempt_id,
            "label": self.step.label,
            "knobs": dict(self.step.knobs),
            "full_arm": self.step.full_arm,
            "decode": self.step.decode,
            "result": e.result,
            "active_tokens": e.active,
            "mismatches": e.mismatches,
            "bitwise": e.bitwise,
            "max_abs_diff": e.max_abs_diff,
            "effect": None if e.effect is None else vars(e.effect),
            "effect_text": e.effect_text,
            "not_read_back": list(e.not_read_back),
            "reason": e.reason,
            "verified": e.verified,
        }


@dataclass(frozen=True)
class FixResult:
    document: dict[str, Any]
    path: Path
    line: str
    steps: tuple[StepOutcome, ...] = field(default_factory=tuple)

    @property
    def verified(self) -> bool:
        return self.document.get("verified") is not None


def check_request(run_dir: str | Path, case_id: str) -> tuple[Any, dict[str, Any]]:
    """Bad input, refused before anything is loaded or written (exit 2): not a run
    directory, a case not in the plan, a case without a sealed verdict, a case that is not
    ``fail``. Returns the run's inputs (``localize.inputs.RunInputs``) and its sealed rows."""
    from xconf.localize.errors import LocalizeError
    from xconf.localize.inputs import load_inputs
    from xconf.verify import open_run_dir

    store = open_run_dir(Path(run_dir))
    rows = sealed_rows(store.path)
    if case_id not in rows:
        raise FixError(
            "fix.unknown_case",
            f"case {case_id!r} is not in plan.jsonl ({len(rows)} planned cases)",
            "CASE_ID",
        )
    try:
        inputs = load_inputs(store.path, case_id)
    except LocalizeError as exc:
        raise FixError(exc.code.replace("localize.", "fix.", 1), exc.message, exc.path) from exc
    comparison = read_json(inputs.attempt_path / "comparison.json")
    result = comparison.get("result") if isinstance(comparison, dict) else None
    if result != "fail":
        why = (
            "there is no drift to remove"
            if result == "pass"
            else "the fix search removes drift, and only a fail verdict measured one"
        )
        raise FixError(
            "fix.case_not_failing",
            f"case {case_id} ({inputs.case.label()}) is {result}: {why}",
            "CASE_ID",
        )
    return inputs, rows


def _start(run: Path, inputs: Any, adapter: Any, notes: list[str]) -> dict[str, Any]:
    """Where the drift begins: the sealed localization of this attempt, or localize now."""
    from xconf.localize.service import localize_case

    document = latest_localization(run, inputs.case.case_id)
    how = "sealed"
    if (
        document is None
        or document.get("status") == "error"
        or document.get("attempt_id") != inputs.attempt_id
    ):
        how = "ran"
        try:
            document = localize_case(run, inputs.case.case_id, adapter=adapter).document
        except XconfError as exc:
            notes.append(
                f"localize could not name a first divergent module ([{exc.code}] "
                f"{exc.message}): the search starts from the first kind"
            )
            return {"tap": None, "tap_kind": None, "kind": start_kind(None), "localize": exc.code}
    first = document.get("first_divergence")
    tap_kind = first.get("kind") if isinstance(first, dict) else None
    label = first.get("label") if isinstance(first, dict) else None
    return {
        "tap": label,
        "tap_kind": tap_kind,
        "kind": start_kind(tap_kind) if label is not None else "logits",
        "localize": how,
        "line": document.get("line"),
    }


def _unsupported(
    plan: FixPlan, adapter: Any, ladder: tuple[Step, ...], catalog: Any
) -> dict[str, str]:
    """Each step knob the runtime would not apply (its evidence), from binding the steps'
    cases: no engine is built, nothing is written."""
    refused: dict[str, str] = {}
    for number, step in enumerate(ladder):
        case, _ = fix_case_row(plan, step, number)
        bound = execution(plan, case, catalog, adapter.device).cases[0]
        binding = adapter.bind(bound, plan.inputs.identity)
        for side in (binding.rollout, binding.training):
            for knob in side.knobs:
                if dict(step.knobs).get(knob.path) is not None and knob.status != "applied":
                    refused.setdefault(knob.path, f"{knob.status}: {knob.evidence}")
    return refused


def fix_case(
    run_dir: str | Path,
    case_id: str,
    *,
    adapter: Any = None,
    runtime: str | None = None,
    output: OutputPolicy | None = None,
    on_step: Callable[[StepOutcome], None] | None = None,
    catalog: Any = None,
) -> FixResult:
    """Search the arms that make failing case ``case_id`` of ``run_dir`` pass, as cases of
    the run; stop at the first verified fix. ``adapter``: the run's; None
    builds the runtime the run used (``runtime`` names another config)."""
    from xconf.localize.replay import refreeze, runtime_for
    from xconf.operators.catalog import SemanticOperatorCatalog

    started = time.perf_counter()
    inputs, rows = check_request(run_dir, case_id)
    plan = fix_plan(inputs, rows)
    run = inputs.store.path
    catalog = catalog if catalog is not None else SemanticOperatorCatalog.from_entry_points()
    notes: list[str] = []
    kv_allowed = inputs.identity.training_kv_cache_allowed
    with third_party_output(run, output):
        own = adapter is None
        if adapter is None:
            adapter = runtime_for(
                runtime if runtime is not None else inputs.runtime_kind,
                inputs.runtime_record,
                chosen=runtime is not None,
            )
        try:
            refreeze(adapter, inputs.identity)  # the sealed frozen tokens, checked again
            # Every arm the search could try, bound before anything runs or is written: an
            # arm this runtime cannot apply is a coded refusal, never a case that errors.
            everything = steps(ALIGN_KINDS[0], inputs.case.knob_dict(), kv_cache_allowed=kv_allowed)
            refused = _unsupported(plan, adapter, everything, catalog)
            decode_path = TRAINING_SCORING_MODE.path
            without_decode = {p: why for p, why in refused.items() if p != decode_path}
            if without_decode:
                shown = "; ".join(f"{p} {why}" for p, why in sorted(without_decode.items()))
                raise FixError("fix.arms_unsupported", f"the arms cannot run here: {shown}")
            start = _start(run, inputs, adapter, notes)
            ladder = steps(start["kind"], inputs.case.knob_dict(), kv_cache_allowed=kv_allowed)
            if decode_path in refused:
                notes.append(f"the decode shape is not run: {decode_path} {refused[decode_path]}")
                ladder = tuple(s for s in ladder if not s.decode)
            if not kv_allowed:
                notes.append(
                    "the identity forbids the training side a KV cache "
                    "(cache_metadata.training_kv_cache), so the full arm in the decode shape "
                    "is not tried"
                )
            source = _source_payload(inputs)
            outcomes: list[StepOutcome] = []
            for number, step in enumerate(ladder):
                case, row = fix_case_row(plan, step, number)
                record = run_case(plan, case, row, adapter, catalog)
                paths = [p for p, _ in step.knobs]
                outcome = StepOutcome(
                    step,
                    case.case_id,
                    record.attempt_id,
                    step_evidence(inputs.store, record, source, paths),
                )
                outcomes.append(outcome)
                if on_step is not None:
                    on_step(outcome)
                if outcome.evidence.verified:
                    break
            residual = (
                None
                if any(o.evidence.verified for o in outcomes)
                else _residual(run, outcomes, adapter)
            )
        finally:
            if own:
                adapter.close()
    line = closing_line(outcomes, residual)
    document = {
        "schema": FIX_SCHEMA,
        "experiment_id": inputs.store.experiment_id,
        "case_id": inputs.case.case_id,
        "attempt_id": inputs.attempt_id,
        "label": inputs.case.label(),
        "start": start,
        "steps": [o.to_dict() for o in outcomes],
        "verified": next((o.to_dict() for o in outcomes if o.evidence.verified), None),
        "residual": residual,
        "notes": notes,
        "line": line,
        "seconds": round(time.perf_counter() - started, 3),
    }
    path = publish(run, inputs.case.case_id, inputs.attempt_id, document)
    return FixResult(document, path, line, tuple(outcomes))


def _source_payload(inputs: Any) -> Any:
    from xconf.report.loader import load_payload

    return load_payload(inputs.attempt_path)


def _residual(run: Path, outcomes: list[StepOutcome], adapter: Any) -> dict[str, Any] | None:
    """What the full arm leaves: its mismatches (the last full-arm case run) and where its
    teacher-forced case first diverges (localize; a decode-shaped case is not localizable)."""
    from xconf.localize.service import localize_case

    full = [o for o in outcomes if o.step.full_arm]
    if not full:
        return None
    last = full[-1]
    shaped = next((o for o in full if not o.step.decode and o.evidence.result == "fail"), None)
    module = None
    if shaped is not None:
        try:
            # Against the case's own repeat floors: the baseline's cross floor holds the very
            # drift the arms removed, so nothing of the full arm's case would rise above it.
            located = localize_case(run, shaped.case_id, adapter=adapter, own_floor=True).document
            first = located.get("first_divergence")
            module = first.get("label") if isinstance(first, dict) else None
            if module is None:
                module = "none of the taps (none above 10x its own repeat floor)"
        except XconfError as exc:
            module = f"an unknown module (localize: [{exc.code}] {exc.message})"
    return {
        "case_id": last.case_id,
        "label": last.step.label,
        "result": last.evidence.result,
        "mismatches": last.evidence.mismatches,
        "active_tokens": last.evidence.active,
        "localized_case_id": None if shaped is None else shaped.case_id,
        "first_divergence": module,
    }


def closing_line(outcomes: list[StepOutcome], residual: Mapping[str, Any] | None) -> str:
    """The one line the terminal, the report and the JSON end with."""
    fix = next((o for o in outcomes if o.evidence.verified), None)
    if fix is not None:
        e = fix.evidence
        return (
            f"verified fix: {fix.step.label} ({e.mismatches} of {e.active} over the threshold; "
            f"{e.bitwise} of {e.active} bitwise)"
        )
    if residual is None:
        return "no arm removes the drift; the full arm was not run"
    if residual["result"] not in ("fail", "pass"):
        return (
            f"no arm removes the drift; the full arm's case gave no verdict "
            f"({residual['result']}), first divergence now at {residual['first_divergence']}"
        )
    return (
        f"no arm removes the drift; the full arm leaves {residual['mismatches']} over, "
        f"first divergence now at {residual['first_divergence'] or 'an unknown module'}"
    )


def publish(run: Path, case_id: str, attempt_id: str, document: dict[str, Any]) -> Path:
    def payload(fix_id: str, name: str) -> bytes:
        return json_bytes({**document, "fix_id": fix_id})

    def seal(fix_id: str, digests: Mapping[str, str]) -> dict[str, Any]:
        return {
            "schema": SEAL_SCHEMA,
            "case_id": case_id,
            "attempt_id": attempt_id,
            "fix_id": fix_id,
            "files": dict(digests),
        }

    with real_dir(run, FIX_DIR, case_id, attempt_id) as parent:
        fix_id = publish_sealed(parent, (DOCUMENT_NAME,), payload, seal)
        return parent.path / fix_id


@dataclass(frozen=True)
class FixFailure:
    case_id: str
    label: str
    error: XconfError

    @property
    def line(self) -> str:
        where = f" at '{self.error.path}'" if self.error.path else ""
        return (
            f"fix {self.case_id} ({self.label}) failed: [{self.error.code}]{where}: "
            f"{self.error.message}"
        )


def after_verdict(
    on_step: Callable[[StepOutcome], None],
    on_result: Callable[[FixResult | None], None],
    on_error: Callable[[FixFailure], None],
) -> Callable[[Any, Any, OutputPolicy], None]:
    """The ``fix=true`` hook: the fix search of the run's baseline when it fails (a failing
    intervention is explained by its knob; the baseline's drift is the one arms remove);
    ``on_result(None)`` when the baseline does not fail."""

    def hook(summary: Any, adapter: Any, output: OutputPolicy) -> None:
        baseline = next((r for r in summary.records if r.kind == "baseline"), None)
        if baseline is None or baseline.result != "fail":
            on_result(None)
            return
        try:
            result = fix_case(
                summary.experiment_dir,
                baseline.case_id,
                adapter=adapter,
                output=output,
                on_step=on_step,
            )
        except XconfError as error:
            on_error(FixFailure(baseline.case_id, baseline.label, error))
            return
        on_result(result)

    return hook
