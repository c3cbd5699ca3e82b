"""The knob allowlist, lifecycles and value normalization."""

from __future__ import annotations

import pytest

from xconf.knobs import (
    DERIVED_KNOBS,
    KNOBS,
    LIFECYCLE_ORDER,
    KnobValueError,
    flatten_knobs,
    normalize_value,
)

DESIGN_TABLE = {
    "batch.size": "request",
    "rollout.tensor_parallel_size": "process",
    "rollout.context_parallel_size": "process",
    "training.sharding": "process",
    "rollout.dtype": "engine_construction",
    "rollout.enable_prefix_caching": "engine_construction",
    "rollout.enforce_eager": "engine_construction",
    "training.attention_backend": "engine_construction",
    "training.compute_dtype": "engine_construction",
    "logp.backend": "engine_construction",
}


def test_allowlist_and_lifecycles_match_the_design() -> None:
    contract = {path: spec.lifecycle for path, spec in KNOBS.items() if spec.tier == "contract"}
    assert contract == DESIGN_TABLE
    assert LIFECYCLE_ORDER == ("request", "engine_construction", "process")


def test_derived_knobs_are_never_allow_listed() -> None:
    assert DERIVED_KNOBS.isdisjoint(KNOBS)
    assert {"rollout.vocab_layout", "training.vocab_layout"} <= DERIVED_KNOBS


@pytest.mark.parametrize(
    ("path", "raw", "value"),
    [
        ("batch.size", 8, 8),
        ("batch.size", 8.0, 8),
        ("rollout.enforce_eager", False, False),
        ("rollout.dtype", "BF16", "bfloat16"),
        ("rollout.dtype", " fp32 ", "float32"),
        ("training.compute_dtype", "torch.float16", "float16"),
        ("training.attention_backend", "flash_attention", "flash_attention_2"),
        ("logp.backend", "Default", "native"),
        ("logp.backend", "acme.any_backend", "acme.any_backend"),  # existence checked at binding
    ],
)
def test_normalize_value(path, raw, value) -> None:
    normalized = normalize_value(KNOBS[path], raw)
    assert normalized == value and type(normalized) is type(value)


@pytest.mark.parametrize(
    ("path", "raw"),
    [
        ("batch.size", 0),
        ("batch.size", -1),
        ("batch.size", 2.5),
        ("batch.size", float("nan")),
        ("batch.size", True),
        ("batch.size", 5000),
        ("rollout.enforce_eager", 1),
        ("rollout.enforce_eager", "true"),
        ("rollout.dtype", "int8"),
        ("rollout.dtype", 16),
        ("training.sharding", "zero3"),
        ("logp.backend", "  "),
    ],
)
def test_refused_values(path, raw) -> None:
    with pytest.raises(KnobValueError):
        normalize_value(KNOBS[path], raw)


def test_flatten_knobs() -> None:
    tree = {"batch": {"size": 2}, "rollout": {"dtype": "bf16", "x": {"y": 1}}}
    assert flatten_knobs(tree) == {"batch.size": 2, "rollout.dtype": "bf16", "rollout.x.y": 1}


@pytest.mark.parametrize(
    ("knobs", "rollout", "training", "launched"),
    [
        ({}, 1, 1, 1),
        ({"training.sharding": "fsdp"}, 1, 2, 2),
        ({"training.sharding": "fsdp2"}, 1, 2, 2),
        ({"rollout.tensor_parallel_size": 4, "training.sharding": "fsdp"}, 4, 2, 4),
        ({"rollout.tensor_parallel_size": 2, "rollout.context_parallel_size": 2}, 4, 1, 4),
    ],
)
def test_each_side_world_comes_from_its_own_knobs(knobs, rollout, training, launched) -> None:
    from xconf.knobs import side_worlds

    worlds = side_worlds(knobs)
    assert (worlds.rollout, worlds.training, worlds.launched) == (rollout, training, launched)


def test_side_worlds_refuse_an_unknown_sharding() -> None:
    from xconf.knobs import side_worlds

    with pytest.raises(KnobValueError):
        side_worlds({"training.sharding": "zero3"})
