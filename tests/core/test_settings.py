"""Each side's settings follow from the knob table: one field per knob of the side, and
``settings_for`` fills each with the knob's materialized value (never the request)."""

from __future__ import annotations

import inspect
from dataclasses import fields

import pytest

from xconf.errors import RuntimeMaterializationError
from xconf.knobs import (
    KNOBS,
    ROLLOUT_KV_CACHE_DTYPE,
    TRAINING_ATTENTION_BACKEND,
    TRAINING_PARAM_DTYPE,
)
from xconf.runtime.materialization import settings_for
from xconf.runtime.protocol import SideBinding, planned_application, unsupported_application
from xconf.runtime.settings import RolloutSettings, TrainingSettings, setting_name


@pytest.mark.parametrize(
    ("side", "kind"), [("rollout", RolloutSettings), ("training", TrainingSettings)]
)
def test_one_documented_field_per_knob_of_the_side(side, kind) -> None:
    expected = {setting_name(s) for s in KNOBS.values() if s.side in (side, "both")}
    assert {f.name for f in fields(kind)} == expected
    source = inspect.getsource(kind)
    for spec in KNOBS.values():  # each field's docstring names its knob
        if spec.side in (side, "both"):
            assert f"``{spec.path}``" in source


def test_settings_hold_the_materialized_value_and_defaults_for_undeclared_knobs() -> None:
    knobs = (
        planned_application(
            TRAINING_ATTENTION_BACKEND.path, "training", "native", "sdpa", "applied", "x"
        ),
        unsupported_application(TRAINING_PARAM_DTYPE.path, "training", "bfloat16", "unsharded"),
    )
    training = settings_for(SideBinding("training", knobs, "float32", ()), TrainingSettings)
    assert training.attention_backend == "sdpa"  # what the runtime configures, not "native"
    assert training.param_dtype is None  # declared and not materialized: nothing to build
    assert (training.reduce_dtype, training.remove_padding) == ("none", False)  # defaults
    assert RolloutSettings().kv_cache_dtype == "auto"


def test_a_knob_of_the_other_side_is_refused_with_its_path() -> None:
    knobs = (
        planned_application(ROLLOUT_KV_CACHE_DTYPE.path, "rollout", "fp8", "fp8", "applied", "x"),
    )
    with pytest.raises(RuntimeMaterializationError) as info:
        settings_for(SideBinding("training", knobs, "float32", ()), TrainingSettings)
    assert (info.value.code, info.value.path) == (
        "runtime.knob_side",
        f"training:{ROLLOUT_KV_CACHE_DTYPE.path}",
    )
    assert settings_for(SideBinding("rollout", (), "float32", ()), RolloutSettings).dtype is None
