"""Each side's settings follow from the knob table: one field per knob of the side, and
``settings_for`` fills each with the knob's materialized value (never the request)."""

from __future__ import annotations

import ast
import inspect
import itertools
import textwrap
from dataclasses import fields

import pytest

from xconf.errors import RuntimeMaterializationError
from xconf.knobs import (
    BATCH_SIZE,
    KNOBS,
    LOGP_BACKEND,
    ROLLOUT_KV_CACHE_DTYPE,
    TRAINING_ATTENTION_BACKEND,
    TRAINING_PARAM_DTYPE,
)
from xconf.runtime.materialization import settings_for
from xconf.runtime.protocol import SideBinding, planned_application, unsupported_application
from xconf.runtime.settings import RolloutSettings, TrainingSettings, setting_name


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


@pytest.mark.parametrize(
    ("side", "kind"), [("rollout", RolloutSettings), ("training", TrainingSettings)]
)
def test_one_documented_field_per_knob_of_the_side(side, kind) -> None:
    """The name rule is the one "apply to settings": every knob of the side maps to exactly
    one field, no two knobs to the same one, no field without its knob, and the field's own
    docstring names the knob it holds."""
    specs = [s for s in KNOBS.values() if s.side in (side, "both")]
    names = {spec.path: setting_name(spec) for spec in specs}
    assert len(set(names.values())) == len(specs)  # injective: one field per knob
    assert {f.name for f in fields(kind)} == set(names.values())  # and nothing else
    docs = _field_docs(kind)
    for path, name in names.items():
        assert docs[name].startswith(f"``{path}``: "), (name, docs[name])


def test_the_name_rule_strips_the_side_and_keeps_other_namespaces() -> None:
    assert setting_name(ROLLOUT_KV_CACHE_DTYPE) == "kv_cache_dtype"
    assert setting_name(TRAINING_PARAM_DTYPE) == "param_dtype"
    assert setting_name(LOGP_BACKEND) == "logp_backend"
    assert setting_name(BATCH_SIZE) == "batch_size"


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
