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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from xconf.canonical import canonical_json
from xconf.errors import XconfError
from xconf.experiment import Case, Identity
from xconf.knobs import BATCH_SIZE, LOGP_BACKEND, TRAINING_SCORING_MODE
from xconf.localize.capture import Recorder, Rows
from xconf.localize.errors import LocalizeError
from xconf.localize.names import Flavour, NameMap, Tap
from xconf.localize.sides import side_module


def runtime_for(
    kind: str, recorded: Mapping[str, Any] | None = None, *, chosen: bool = False
) -> Any:
    """The adapter a run of ``kind`` used: the installed catalog's runtime of that name
    (``conf/runtime/<kind>.yaml``) built with the options the run's adapter was built with
    (``recorded``: actual.json's provenance.runtime), so a run with ``runtime.model.path=DIR``
    is localized on DIR, not on the default model.

    A run directory names no code: ``kind`` must be a catalog name (a path is
    ``config.unknown_runtime``), the class is the catalog's, and the recorded options apply
    only when they were recorded for that class and the sides the config pairs today (its
    sides are not another config's); they are data (no Hydra key, no interpolation:
    :func:`~xconf.runtime.loading.check_option_data`). A run that trusted a checkpoint's own
    code is refused. ``chosen``: the user named the runtime (``--runtime``); another runtime
    then gets its own config's options alone instead of a refusal."""
    from xconf.runtime.loading import (
        catalog_name,
        catalog_runtime,
        check_option_data,
        conf_dir,
        pairing,
        runtime_config,
    )

    name = catalog_name(conf_dir(), kind)
    options = recorded.get("options") if recorded else None
    if not (recorded and isinstance(options, Mapping) and options):
        return catalog_runtime(name)
    check_option_data(options)  # data first: nothing in it is resolved or built
    config = runtime_config(name)
    target = str(config.get("_target_", ""))
    sides = pairing(config)
    if str(recorded.get("target", "")).replace(":", ".") != target.replace(":", ".") or any(
        options.get(k) != v for k, v in sides.items()
    ):
        if chosen:
            return catalog_runtime(name)
        raise LocalizeError(
            "localize.runtime_mismatch",
            f"the run's adapter was {str(recorded.get('target'))[:120]!r} "
            f"{_named(options)[:200]}, conf/runtime/ names {target!r} {_named(sides)} "
            f"for '{name}': pass --runtime NAME",
            "runtime",
        )
    if options.get("trust_remote_code"):
        raise LocalizeError(
            "localize.remote_code",
            "the run trusted the checkpoint's own code (trust_remote_code); localize never "
            "runs code a run directory asks for",
            "runtime.trust_remote_code",
        )
    return catalog_runtime(name, options)


def _named(options: Mapping[str, Any]) -> str:
    from xconf.runtime.loading import pairing

    return "(" + ", ".join(f"{k}={v}" for k, v in pairing(options).items()) + ")"


def refreeze(adapter: Any, sealed: Identity) -> Identity:
    """Freeze the sealed identity's recipe again; the result must be the sealed identity."""
    identity = sealed
    recipe = json.loads(sealed.recipe)
    if recipe:
        from xconf.adapters.checkpoint.identity import thaw_recipe

        # The keys freezing added (spec digest, tokenizer location, dataset digest) are not
        # part of the recipe the experiment declared: the recipe parser refuses them.
        recipe = thaw_recipe(recipe)
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


@dataclass(frozen=True)
class ModelShape:
    layers: int
    hidden: int
    vocab: int


def model_shape(adapter: Any) -> ModelShape:
    """Decoder layers, hidden size and vocabulary of the run's checkpoint, as transformers
    reads its config (GPT-2's ``n_layer`` is its ``num_hidden_layers``; a nested
    ``text_config`` holds the decoder's)."""
    from transformers import AutoConfig

    path = str(adapter.record.path)
    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=False)
    except (OSError, ValueError, KeyError) as exc:
        raise LocalizeError(
            "localize.bad_config", f"config.json does not load: {exc}", f"{path}/config.json"
        ) from exc
    text = getattr(config, "text_config", None) or config
    values = [getattr(text, k, None) for k in ("num_hidden_layers", "hidden_size", "vocab_size")]
    if not all(isinstance(v, int) and v > 0 for v in values):
        raise LocalizeError(
            "localize.bad_config",
            "config.json does not give num_hidden_layers, hidden_size and vocab_size",
            f"{path}/config.json",
        )
    layers, hidden, vocab = (int(v) for v in values)  # type: ignore[arg-type]
    return ModelShape(layers, hidden, vocab)


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
        raise LocalizeError("localize.no_native_operator", "no native operator", LOGP_BACKEND.path)
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
    if any(path == BATCH_SIZE.path for path, _ in case.changed):
        raise LocalizeError(
            "localize.batch_size_case",
            "localize replays one request at a time, so a batch.size intervention cannot be "
            "localized",
            f"case {case.case_id}",
        )
    if case.knob_dict().get(TRAINING_SCORING_MODE.path) == "decode":
        raise LocalizeError(
            "localize.decode_shaped_training",
            "the case scores the training side in the rollout engine's decode steps; localize "
            "compares one forward per sample on that side (localize the same arms in "
            f"{TRAINING_SCORING_MODE.path}=full)",
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
    from xconf.side_scoring import frozen_inputs

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
