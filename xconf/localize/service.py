"""``localize_case``: the whole localization of one case, from run directory to artifact;
``localize_failing``: every failing case of a finished run; ``after_verdict``: that, as the
hook a front end hands the run service for ``--localize``.

The front-ends only parse arguments and draw results (``xconf/cli/localize.py``); the run
service (``xconf/session.py``) calls the hook it is given and never imports this module.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xconf.artifacts.localization import LOCALIZE_SCHEMA
from xconf.errors import XconfError
from xconf.localize.analysis import (
    FACTOR,
    MIN_FLOOR,
    TapResult,
    analyse,
    first_divergence,
    verdict_line,
)
from xconf.localize.artifact import publish, publish_failure
from xconf.localize.budget import select
from xconf.localize.inputs import load_inputs
from xconf.localize.names import name_map, taps
from xconf.localize.replay import (
    architecture,
    check_replayable,
    model_shape,
    refreeze,
    runtime_for,
    score_side,
)
from xconf.run_output import OutputPolicy, third_party_output

FLOOR_DEFINITION = (
    "per tap, the largest of: the baseline case's rollout side against its training side, "
    "and each baseline side scored twice; a tap diverges when the case's rollout-vs-training "
    f"relative L2 difference exceeds {FACTOR:g} x max(floor, {MIN_FLOOR:g})"
)
BASELINE_FLOOR_DEFINITION = (
    "the case is the baseline: per tap, the larger of each baseline side scored twice; a tap "
    "diverges when the baseline's own rollout-vs-training relative L2 difference exceeds "
    f"{FACTOR:g} x max(floor, {MIN_FLOOR:g})"
)


OWN_FLOOR_DEFINITION = (
    "the case against its own repeat floors (as the baseline is localized): per tap, the "
    "larger of each of the case's sides scored twice; a tap diverges when the case's "
    f"rollout-vs-training relative L2 difference exceeds {FACTOR:g} x max(floor, {MIN_FLOOR:g})"
)


FAILING = ("fail",)  # results whose drift localize explains (errors have no activations)


@dataclass(frozen=True)
class Localization:
    document: dict[str, Any]
    path: Path
    line: str


def _tap_row(result: TapResult, names: Any, flavours: dict[str, Any]) -> dict[str, Any]:
    return {
        "key": result.tap.key,
        "label": result.tap.label,
        "kind": result.tap.kind,
        "layer": result.tap.layer,
        "modules": {side: names.module(f, result.tap).module for side, f in flavours.items()},
        "case_relative": result.case.relative,
        "case_max_abs": result.case.max_abs,
        "baseline_cross": result.baseline_cross,
        "rollout_repeat": result.rollout_repeat,
        "training_repeat": result.training_repeat,
        "floor": result.floor,
        "ratio": result.ratio,
        "above": result.above,
    }


def localize_case(
    run_dir: str | Path,
    case_id: str,
    *,
    adapter: Any = None,
    runtime: str | None = None,
    output: OutputPolicy | None = None,
    own_floor: bool = False,
) -> Localization:
    """Localize ``case_id`` of ``run_dir`` with ``adapter``; without one, a fresh runtime of
    config ``runtime`` (``conf/runtime/NAME.yaml``), by default the one the run used.

    ``output``: the engines' own output goes to the run's ``xconf.log`` as in a run (the
    run directory is known to be one by then); None leaves it where it is (``--localize``
    after a run, which captures it already).

    ``own_floor``: measure the floor on the case itself, as the baseline is localized (where
    do the two engines start to disagree *at this case's settings*), instead of on the
    baseline; the fix search asks it of the full arm's case, whose drift is below the
    baseline's own."""
    started = time.perf_counter()
    inputs = load_inputs(Path(run_dir), case_id)
    check_replayable(inputs.case)
    with third_party_output(inputs.store.path, output):
        if adapter is None:
            adapter = runtime_for(
                runtime if runtime is not None else inputs.runtime_kind,
                inputs.runtime_record,
                chosen=runtime is not None,
            )
        frozen = refreeze(adapter, inputs.identity)
        names = name_map(architecture(adapter), f"runtime {inputs.runtime_kind}")
        shape = model_shape(adapter)
        layers = shape.layers
        tap_list = taps(layers)
        base, case = (inputs.case if own_floor else inputs.baseline), inputs.case
        passes = 4 if case.case_id == base.case_id else 6
        selection = select(
            frozen,
            inputs.attempt_path,
            hidden=shape.hidden,
            vocab=shape.vocab,
            layers=layers,
            passes=passes,
        )
        identity = selection.identity
        rollout_base = score_side(adapter, base, "rollout", identity, names, tap_list, 2)
        rollout_case = (
            rollout_base
            if case.case_id == base.case_id
            else score_side(adapter, case, "rollout", identity, names, tap_list, 1)
        )
        training_base = score_side(adapter, base, "training", identity, names, tap_list, 2)
        training_case = (
            training_base
            if case.case_id == base.case_id
            else score_side(adapter, case, "training", identity, names, tap_list, 1)
        )
        results = analyse(
            tap_list,
            (rollout_base.passes[0], rollout_base.passes[1]),
            (training_base.passes[0], training_base.passes[1]),
            rollout_case.passes[0],
            training_case.passes[0],
            of_baseline=case.case_id == base.case_id,
        )
    flavours = {"rollout": rollout_case.flavour, "training": training_case.flavour}
    first = first_divergence(results)
    line = verdict_line(first)
    document = {
        "schema": LOCALIZE_SCHEMA,
        "experiment_id": inputs.store.experiment_id,
        "case_id": case.case_id,
        "attempt_id": inputs.attempt_id,
        "baseline_case_id": inputs.baseline.case_id,
        "floor_case_id": base.case_id,  # whose passes measured the floor (own_floor: the case)
        "changed": dict(case.changed),
        "identity_sha256": frozen.digest(),
        "runtime_kind": inputs.runtime_kind,
        "architecture": names.architecture,
        "checkpoint_sha256": adapter.record.checkpoint_sha256,
        # A sha256 checkpoint id was checked against the rebuilt weights when re-freezing;
        # any other id cannot prove the weights are the run's.
        "checkpoint_verified": frozen.checkpoint_id.startswith("sha256:"),
        "num_layers": layers,
        "scoring": {
            "mode": identity.scoring_mode,
            "requests": "one at a time",
            "selected_logprob_operator": "native",
            "positions": "0 .. T-2 of every replayed sample",
            "samples": list(selection.samples),
            "samples_note": selection.note,
        },
        "factor": FACTOR,
        "min_floor": MIN_FLOOR,
        "floor_definition": OWN_FLOOR_DEFINITION
        if own_floor and case.case_id != inputs.baseline.case_id
        else BASELINE_FLOOR_DEFINITION
        if case.case_id == base.case_id
        else FLOOR_DEFINITION,
        "taps": [_tap_row(r, names, flavours) for r in results],
        "first_divergence": None if first is None else _tap_row(first, names, flavours),
        "sides": flavours,
        "line": line,
        "seconds": round(time.perf_counter() - started, 3),
    }
    published = publish(inputs.store.path, case.case_id, inputs.attempt_id, document)
    return Localization({**document, "localize_id": published.localize_id}, published.path, line)


@dataclass(frozen=True)
class LocalizeFailure:
    """A failing case ``--localize`` could not localize: its coded error, and where the
    failure was recorded (None: recording it failed too, ``record_error`` says why)."""

    case_id: str
    label: str
    error: XconfError
    path: Path | None
    record_error: XconfError | None = None

    @property
    def line(self) -> str:
        where = f" at '{self.error.path}'" if self.error.path else ""
        return (
            f"localize {self.case_id} ({self.label}) failed: "
            f"[{self.error.code}]{where}: {self.error.message}"
        )


def localize_failing(
    summary: Any,
    adapter: Any,
    *,
    on_result: Callable[[Localization], None],
    on_error: Callable[[LocalizeFailure], None],
) -> int:
    """Localize every failing case of ``summary`` (a ``RunSummary``) with the run's adapter,
    handing each result to ``on_result``. A case that cannot be localized is recorded
    (:func:`~xconf.localize.artifact.publish_failure`) and goes to ``on_error`` with its
    coded error; the others still run. Returns how many cases were failing."""
    failing = [r for r in summary.records if r.result in FAILING]
    run_dir = Path(summary.experiment_dir)
    for record in failing:
        try:
            result = localize_case(run_dir, record.case_id, adapter=adapter)
        except XconfError as error:
            on_error(_record_failure(run_dir, record, error))
            continue
        on_result(result)
    return len(failing)


def _record_failure(run_dir: Path, record: Any, error: XconfError) -> LocalizeFailure:
    try:
        published = publish_failure(run_dir, record.case_id, record.attempt_id, error)
    except XconfError as failed:
        return LocalizeFailure(record.case_id, record.label, error, None, failed)
    return LocalizeFailure(record.case_id, record.label, error, published.path)


def after_verdict(
    on_result: Callable[[Localization | None], None], on_error: Callable[[LocalizeFailure], None]
) -> Callable[[Any, Any, OutputPolicy], None]:
    """The ``--localize`` hook (a ``session.AfterVerdict``): every failing case of the run
    localized with the run's adapter, each result to ``on_result``; ``on_result(None)``
    when no case failed."""

    def hook(summary: Any, adapter: Any, output: OutputPolicy) -> None:
        # Localizing builds engines again: their output goes where the run's went.
        with third_party_output(Path(summary.experiment_dir), output):
            failing = localize_failing(summary, adapter, on_result=on_result, on_error=on_error)
        if not failing:
            on_result(None)

    return hook
