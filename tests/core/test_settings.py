"""Each side's settings follow from its handlers and the knob table: one field per knob the
side honours, each default the engine's own, and ``settings_for`` fills each with the knob's
materialized value (never the request). The engines' construction records are built from
the settings field by field, with the settings' defaults: no knob is copied by hand."""

from __future__ import annotations

import ast
import inspect
import itertools
import textwrap
from dataclasses import MISSING, fields
from typing import Any

import pytest

from xconf.adapters.cpu_smoke import side as cpu_smoke
from xconf.adapters.hf import side as hf
from xconf.adapters.hf.model import SETTINGS_NOT_BUILT as HF_NOT_BUILT
from xconf.adapters.hf.model import TrainingScorerConfig
from xconf.adapters.hf.settings import HfSettings
from xconf.adapters.vllm import side as vllm
from xconf.adapters.vllm.engine import SETTINGS_NOT_BUILT as VLLM_NOT_BUILT
from xconf.adapters.vllm.engine import RolloutEngineConfig
from xconf.adapters.vllm.settings import VllmSettings
from xconf.errors import RuntimeMaterializationError
from xconf.knobs import (
    BATCH_SIZE,
    KNOBS,
    LOGP_BACKEND,
    ROLLOUT_ENFORCE_EAGER,
    ROLLOUT_KV_CACHE_DTYPE,
    TRAINING_ATTENTION_BACKEND,
    TRAINING_PARAM_DTYPE,
)
from xconf.runtime.materialization import settings_for
from xconf.runtime.protocol import SideBinding, planned_application, unsupported_application
from xconf.runtime.settings import setting_name
from xconf.runtime.side import SideSpec

SPECS: dict[str, SideSpec[Any, Any]] = {
    "vllm": vllm.VLLM,
    "hf.training": hf.TRAINING,
    "hf.reference": hf.REFERENCE,
    "cpu_smoke.rollout": cpu_smoke.ROLLOUT,
    "cpu_smoke.training": cpu_smoke.TRAINING,
}


def _field_docs(kind: type) -> dict[str, str]:
    """Each field of a settings class and the docstring written under it."""
    (cls,) = ast.parse(textwrap.dedent(inspect.getsource(kind))).body
    assert isinstance(cls, ast.ClassDef)
    docs: dict[str, str] = {}
    for field, doc in itertools.pairwise(cls.body):
        if isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name):
            docstring = isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant)
            docs[field.target.id] = str(doc.value.value) if docstring else ""  # type: ignore[attr-defined]
    return docs


@pytest.mark.parametrize("spec", SPECS.values(), ids=SPECS.keys())
def test_one_documented_field_per_knob_the_side_honours(spec) -> None:
    """The name rule is the one "apply to settings": every knob the side has a handler for
    (and ``logp.backend``, the operator binding's) maps to exactly one field, no two knobs to
    the same one, no field without its knob, every field has a default (the engine's own),
    and the field's own docstring names the knob it holds."""
    knobs = [KNOBS[p] for p in spec.handlers] + [LOGP_BACKEND]
    assert all(k.side in (spec.side, "both") for k in knobs)
    names = {knob.path: setting_name(knob) for knob in knobs}
    assert len(set(names.values())) == len(knobs)  # injective: one field per knob
    assert {f.name for f in fields(spec.settings)} == set(names.values())  # and nothing else
    assert all(f.default is not MISSING for f in fields(spec.settings))
    docs = _field_docs(spec.settings)
    for path, name in names.items():
        assert docs[name].startswith(f"``{path}``: "), (name, docs[name])


@pytest.mark.parametrize(
    ("settings", "config", "not_built"),
    [
        (VllmSettings, RolloutEngineConfig, VLLM_NOT_BUILT),
        (HfSettings, TrainingScorerConfig, HF_NOT_BUILT),
    ],
)
def test_an_engine_config_is_built_from_the_settings_with_their_defaults(
    settings, config, not_built
) -> None:
    """The engine's construction record holds every setting but the ones no engine field
    takes, by the same name, and its defaults are the settings' own (one place)."""
    built = {f.name: f for f in fields(config)}
    assert {f.name for f in fields(settings)} - set(built) == not_built
    for field in fields(settings):
        if field.name not in not_built:
            assert built[field.name].default == field.default, field.name
    assert config.from_settings(settings(), model_path="m") == config(model_path="m")


def test_the_name_rule_strips_the_side_and_keeps_other_namespaces() -> None:
    assert setting_name(ROLLOUT_KV_CACHE_DTYPE) == "kv_cache_dtype"
    assert setting_name(TRAINING_PARAM_DTYPE) == "param_dtype"
    assert setting_name(LOGP_BACKEND) == "logp_backend"
    assert setting_name(BATCH_SIZE) == "batch_size"


def test_settings_hold_the_materialized_value_and_defaults_for_the_rest() -> None:
    knobs = (
        planned_application(
            TRAINING_ATTENTION_BACKEND.path, "training", "native", "eager", "applied", "x"
        ),
        unsupported_application(TRAINING_PARAM_DTYPE.path, "training", "bfloat16", "unsharded"),
    )
    training = settings_for(SideBinding("training", knobs, "float32", ()), HfSettings)
    assert training.attention_backend == "eager"  # what the runtime configures
    assert training.param_dtype == "none"  # declared and not materialized: the default
    assert (training.reduce_dtype, training.remove_padding) == ("none", False)  # undeclared
    assert VllmSettings().kv_cache_dtype == "auto"


def test_an_unsupported_flag_builds_the_engine_default_never_false() -> None:
    """``bool(None)`` once built ``enforce_eager=False`` for a flag nothing materialized."""
    knobs = (unsupported_application(ROLLOUT_ENFORCE_EAGER.path, "rollout", False, "why"),)
    rollout = settings_for(SideBinding("rollout", knobs, "float32", ()), VllmSettings)
    assert rollout.enforce_eager is True
    assert RolloutEngineConfig.from_settings(rollout, model_path="m").enforce_eager is True


def test_a_knob_of_the_other_side_is_refused_with_its_path() -> None:
    knobs = (
        planned_application(ROLLOUT_KV_CACHE_DTYPE.path, "rollout", "fp8", "fp8", "applied", "x"),
    )
    with pytest.raises(RuntimeMaterializationError) as info:
        settings_for(SideBinding("training", knobs, "float32", ()), HfSettings)
    assert (info.value.code, info.value.path) == (
        "runtime.knob_side",
        f"training:{ROLLOUT_KV_CACHE_DTYPE.path}",
    )
    assert settings_for(SideBinding("rollout", (), "float32", ()), VllmSettings).dtype == "float32"
