"""Score a case's frozen tokens again, with taps, on engines the runtime adapter builds.

The adapter is the one the run used (named by ``materialized.json``'s runtime kind, built
from ``conf/runtime/``), so each side is constructed exactly as the run constructed it.
Two differences, both recorded in ``localize.json``: the selected-logprob operator is the
runtime's native one (activations do not depend on it, and the native rollout engine
returns no full-vocabulary rows), and requests go one at a time so that every forward call
belongs to one frozen sample.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from xconf.canonical import canonical_json
from xconf.errors import XconfError
from xconf.experiment import Case, Identity
from xconf.localize.capture import Recorder, Rows
from xconf.localize.errors import LocalizeError
from xconf.localize.names import Flavour, NameMap, Tap
from xconf.localize.sides import side_module


def runtime_for(kind: str) -> Any:
    """The adapter a run of ``kind`` used: ``conf/runtime/<kind>.yaml`` instantiated."""
    from xconf.runtime.loading import instantiate_runtime, runtime_config

    return instantiate_runtime(runtime_config(kind.replace("-", "_")))


def refreeze(adapter: Any, sealed: Identity) -> Identity:
    """Freeze the sealed identity's recipe again; the result must be the sealed identity."""
    identity = sealed
    recipe = json.loads(sealed.recipe)
    if recipe:
        # A frozen recipe records the spec digest it was built from; the recipe itself does not
        recipe.pop("model_spec_sha256", None)
        identity = dataclasses.replace(
            sealed,
            token_ids=(),
            selected_token_ids=(),
            active_mask=(),
            attention_mask=(),
            position_ids=(),
            recipe=canonical_json(recipe),
        )
    frozen = adapter.freeze_identity(identity)
    if frozen.digest() != sealed.digest():
        raise LocalizeError(
            "localize.identity_mismatch",
            "freezing the run's identity again does not give the sealed frozen tokens",
            "identity.json",
        )
    return frozen


def architecture(adapter: Any) -> str | None:
    """The checkpoint's architecture (``config.json``), None for a runtime without one."""
    record = getattr(type(adapter), "record", None)
    if record is None:
        return None
    return str(adapter.record.architecture)


def num_layers(adapter: Any) -> int:
    """Decoder layers of the run's checkpoint (its ``config.json``)."""
    from pathlib import Path

    config = json.loads((Path(adapter.record.path) / "config.json").read_text("utf-8"))
    return int(config["num_hidden_layers"])


def execution_case(case: Case) -> Any:
    """The case bound to the runtime-native selected-logprob operator on both sides."""
    from xconf.execution_plan import ExecutionCase
    from xconf.operators.catalog import (
        SELECTED_LOGPROB,
        SIDES,
        OperatorBinding,
        SemanticOperatorCatalog,
    )

    descriptor = SemanticOperatorCatalog.from_entry_points().get(SELECTED_LOGPROB, "native")
    if descriptor is None:
        raise LocalizeError("localize.no_native_operator", "no native operator", "logp.backend")
    rollout, training = (
        OperatorBinding(
            semantic_operation=SELECTED_LOGPROB,
            side=side,
            backend_id=descriptor.backend_id,
            options=(),
            descriptor_fingerprint=descriptor.fingerprint(),
            is_smoke_only=False,
            runtime_native=descriptor.runtime_native,
        )
        for side in SIDES
    )
    return ExecutionCase(case, (rollout, training))


def check_replayable(case: Case) -> None:
    if any(path == "batch.size" for path, _ in case.changed):
        raise LocalizeError(
            "localize.batch_size_case",
            "localize replays one request at a time, so a batch.size intervention cannot be "
            "localized",
            f"case {case.case_id}",
        )


@dataclass(frozen=True)
class SidePasses:
    """One side's captured passes and which kind of module (name-map side) produced them."""

    flavour: Flavour
    passes: tuple[Rows, ...]


def score_side(
    adapter: Any,
    case: Case,
    side: str,
    identity: Identity,
    names: NameMap,
    taps: Sequence[Tap],
    repeats: int,
) -> SidePasses:
    """Build ``side``'s engine for ``case``, score ``repeats`` passes with taps, close it."""
    from xconf.runner import frozen_inputs

    check_replayable(case)
    executable = execution_case(case)
    binding = adapter.bind(executable, identity).side(side)
    refused = [k.path for k in binding.knobs if k.status != "applied"]
    if refused:
        raise LocalizeError(
            "localize.case_not_applied",
            f"the {side} side cannot be built as the case declares: {', '.join(refused)} "
            "not applied by this runtime",
            refused[0],
        )
    inputs = frozen_inputs(identity)
    lengths = [sum(row) for row in identity.attention_mask]
    try:
        engine = adapter.build_engine(binding, executable)
    except XconfError as exc:
        raise LocalizeError(
            "localize.engine_failed", f"building the {side} engine: {exc}", exc.path
        ) from exc
    try:
        module = side_module(engine, side)
        passes = []
        for _ in range(repeats):
            module.before_pass()
            with Recorder(module.module, names, module.flavour, taps) as recorder:
                engine.score(inputs, identity, 1, None)
            passes.append(recorder.rows(lengths))
        return SidePasses(module.flavour, tuple(passes))
    finally:
        engine.close()
