"""What a runtime's checkpoint takes (its vocabulary, its context), known before any engine.

A plan builds no engine and imports no adapter, yet a token id outside the checkpoint's
vocabulary or a sequence longer than its context must be refused at plan time (``xconf plan
--runtime``, ``mode=plan``, a run alike) with nothing written. The adapter class names, in its
source, a torch-free function that reads the limits from the runtime's options alone (the
synthetic model's sizes, a checkpoint's ``config.json``, ``max_model_len``)::

    class MyRuntime:
        input_limits = "my_pkg.limits:input_limits"  # (options) -> InputLimits | None

The class is found in its source as the option check of ``mode=plan`` finds its constructor
(:func:`xconf.runtime.loading.check_options_unimported`); only the named function's module is
imported. A runtime that names none is checked by its own ``check_inputs`` when a run starts;
a recipe's or a dump's rows are known only when the runtime freezes them, and it checks them
then (before a run writes anything).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from xconf.errors import ConfigError
from xconf.experiment import Identity
from xconf.runtime.loading import NON_OPTION_KEYS, class_string, plain_with_target, split_target

LIMITS_ATTRIBUTE = "input_limits"


@dataclass(frozen=True)
class InputLimits:
    """The checkpoint's vocabulary size and the longest sequence its runtime scores;
    ``source`` says where they were read (it is shown in the refusal)."""

    vocab_size: int
    max_len: int
    source: str


def runtime_limits(config: Mapping[str, Any] | DictConfig) -> InputLimits | None:
    """The limits the runtime ``config`` names, or None when its adapter does not say."""
    plain, target = plain_with_target(config)
    named = class_string(*split_target(target), LIMITS_ATTRIBUTE)
    if named is None:
        return None
    module, _, name = named.partition(":")
    try:
        function = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(
            "runtime.bad_limits",
            f"the runtime {target} names input limits '{named}', which cannot be imported: {exc}",
            "runtime._target_",
        ) from exc
    limits = function({str(k): v for k, v in plain.items() if k not in NON_OPTION_KEYS})
    if limits is not None and not isinstance(limits, InputLimits):
        raise ConfigError(
            "runtime.bad_limits",
            f"the runtime {target}'s '{named}' returned {type(limits).__name__}, not InputLimits",
            "runtime._target_",
        )
    return limits


def _first_at_or_above(
    rows: tuple[tuple[int, ...], ...], bound: int
) -> tuple[int, int, int] | None:
    """(row, column, value) of the first entry ``>= bound``; each row is scanned in C first."""
    for i, row in enumerate(rows):
        if row and max(row) >= bound:
            j = next(j for j, value in enumerate(row) if value >= bound)
            return i, j, row[j]
    return None


def check_identity_limits(identity: Identity, limits: InputLimits) -> None:
    """The identity's explicit rows inside the vocabulary and the context (negative and
    non-integer ids were refused when the document was parsed). The error names the first
    offending entry."""
    for field in ("token_ids", "selected_token_ids"):
        found = _first_at_or_above(getattr(identity, field), limits.vocab_size)
        if found is not None:
            i, j, token = found
            raise ConfigError(
                "runtime.token_out_of_vocab",
                f"token id {token} is outside the vocabulary [0, {limits.vocab_size}) "
                f"of {limits.source}",
                f"identity.{field}[{i}][{j}]",
            )
    for i, row in enumerate(identity.token_ids):
        if len(row) > limits.max_len:
            raise ConfigError(
                "runtime.sequence_too_long",
                f"{len(row)} tokens exceed the context of {limits.max_len} of {limits.source}",
                f"identity.token_ids[{i}]",
            )
    found = _first_at_or_above(identity.position_ids, limits.max_len)
    if found is not None:
        i, j, position = found
        raise ConfigError(
            "runtime.sequence_too_long",
            f"position {position} is beyond the context of {limits.max_len} of {limits.source}",
            f"identity.position_ids[{i}][{j}]",
        )


def runtime_device(config: Mapping[str, Any] | DictConfig) -> str | None:
    """The device the runtime runs on as its config or its class's source says (None: unsaid)."""
    plain, target = plain_with_target(config)
    device = plain.get("device")
    return device if isinstance(device, str) else class_string(*split_target(target), "device")


def check_runtime_limits(
    identity: Identity, config: Mapping[str, Any] | DictConfig, scenario_device: str
) -> None:
    """:func:`check_identity_limits` against the runtime ``config``'s limits, if it has any.

    A runtime for another device than the scenario's cannot run it (a run refuses it as
    ``runtime.device_mismatch``; a plan with the default CPU runtime plans a GPU experiment
    for the GPU runtime it names): its model's limits are not the experiment's."""
    device = runtime_device(config)
    if device is not None and device != scenario_device:
        return
    limits = runtime_limits(config)
    if limits is not None:
        check_identity_limits(identity, limits)
