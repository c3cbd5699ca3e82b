"""The Megatron side's knobs: what it builds, and what it refuses on this machine and why
(which knobs each runtime declares at all: tests/core/test_handlers.py)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.megatron.conftest import needs_megatron
from xconf.knobs import (
    KNOBS,
    LOGP_BACKEND,
    TRAINING_APPLY_ROPE_FUSION,
    TRAINING_ATTENTION_BACKEND,
    TRAINING_CROSS_ENTROPY_LOSS_FUSION,
    TRAINING_MASKED_SOFTMAX_FUSION,
    TRAINING_SEQUENCE_PARALLEL,
    TRAINING_SHARDING,
    TRAINING_TENSOR_PARALLEL_SIZE,
    KnobValue,
)
from xconf.runtime.protocol import KnobApplication, KnobRequest, RuntimeView

pytestmark = needs_megatron


def smollm2_shape() -> Any:
    """SmolLM2-135M's shape as Megatron builds it (9 heads, 3 KV heads): TP 1 or 3."""
    from xconf.adapters.megatron.arch import MegatronArch

    return MegatronArch(
        config_path="smollm2/config.json",
        model_type="llama",
        num_layers=30,
        hidden_size=576,
        num_heads=9,
        num_kv_heads=3,
        head_dim=64,
        ffn_hidden_size=1536,
        vocab_size=49152,
        max_positions=8192,
        norm_eps=1e-5,
        rope_theta=1e5,
        tied_embeddings=True,
        qkv_bias=False,
        qk_layernorm=False,
    )


def materialize(path: str, value: KnobValue, **knobs: KnobValue) -> KnobApplication:
    from xconf.adapters.megatron.handlers import HANDLERS

    view = RuntimeView("megatron", "cpu", smollm2_shape())
    request = KnobRequest(KNOBS[path], "training", value, {path: value, **knobs}, view)
    return HANDLERS[path].materialize(request)


@pytest.mark.parametrize(
    ("path", "value", "knobs", "why"),
    [
        (TRAINING_TENSOR_PARALLEL_SIZE.path, 2, {}, "9 attention heads do not split over TP=2"),
        (TRAINING_TENSOR_PARALLEL_SIZE.path, 3, {}, "needs a launched world of 3 ranks"),
        (TRAINING_SEQUENCE_PARALLEL.path, True, {}, "TP is 1"),
        (TRAINING_MASKED_SOFTMAX_FUSION.path, True, {}, "is a CUDA kernel"),
        (
            TRAINING_MASKED_SOFTMAX_FUSION.path,
            True,
            {TRAINING_ATTENTION_BACKEND.path: "sdpa"},
            "SDPA attention has no masked-softmax",
        ),
        (TRAINING_APPLY_ROPE_FUSION.path, True, {}, "Transformer Engine"),
        (
            TRAINING_CROSS_ENTROPY_LOSS_FUSION.path,
            True,
            {LOGP_BACKEND.path: "xconf.reference_logp"},
            "not Megatron's CE",
        ),
        (TRAINING_SHARDING.path, "fsdp", {}, "shards by tensor parallelism"),
        (TRAINING_ATTENTION_BACKEND.path, "flash_attention_2", {}, "no flash_attention_2"),
    ],
)
def test_what_this_machine_cannot_run_is_unsupported_with_the_reason(
    path: str, value: KnobValue, knobs: dict[str, Any], why: str
) -> None:
    app = materialize(path, value, **knobs)
    assert (app.status, app.materialized) == ("unsupported", None)
    assert why in app.evidence, app.evidence


@pytest.mark.parametrize(
    ("path", "value", "materialized"),
    [
        (TRAINING_TENSOR_PARALLEL_SIZE.path, 1, 1),
        (TRAINING_ATTENTION_BACKEND.path, "native", "eager"),
        (TRAINING_ATTENTION_BACKEND.path, "sdpa", "sdpa"),
        (TRAINING_SHARDING.path, "unsharded", "unsharded"),
        (TRAINING_CROSS_ENTROPY_LOSS_FUSION.path, True, True),
        (TRAINING_MASKED_SOFTMAX_FUSION.path, False, False),
    ],
)
def test_what_it_builds(path: str, value: KnobValue, materialized: KnobValue) -> None:
    app = materialize(path, value)
    assert (app.status, app.materialized) == ("applied", materialized)


def test_every_megatron_handler_reads_its_knob_back() -> None:
    from xconf.adapters.megatron.handlers import HANDLERS

    assert all(h.readback is not None for h in HANDLERS.values())
    assert LOGP_BACKEND.path not in HANDLERS  # the operator binding's, as on every runtime


def test_one_documented_setting_per_knob_the_side_honours() -> None:
    """The settings record follows from the handlers: one field per knob (named by the name
    rule), no other field, each docstring naming its knob; the construction record takes
    every knob field from it by name, with the settings' defaults."""
    import ast
    import inspect
    import itertools
    import textwrap
    from dataclasses import fields

    from xconf.adapters.megatron.handlers import HANDLERS
    from xconf.adapters.megatron.model import MegatronConfig
    from xconf.adapters.megatron.settings import MegatronSettings
    from xconf.runtime.settings import setting_name

    names = {setting_name(KNOBS[p]): p for p in [*HANDLERS, LOGP_BACKEND.path]}
    assert {f.name for f in fields(MegatronSettings)} == set(names)
    (cls,) = ast.parse(textwrap.dedent(inspect.getsource(MegatronSettings))).body
    assert isinstance(cls, ast.ClassDef)
    for field, doc in itertools.pairwise(cls.body):
        if isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name):
            text = doc.value.value if isinstance(doc, ast.Expr) else ""  # type: ignore[attr-defined]
            assert str(text).startswith(f"``{names[field.target.id]}``: "), field.target.id
    knob_fields = {f.name for f in fields(MegatronConfig)} - {
        "model_path",
        "device",
        "trust_remote_code",
    }
    assert knob_fields <= set(names)
    built = MegatronConfig.from_settings(MegatronSettings(), model_path="x")
    assert all(getattr(built, n) == getattr(MegatronSettings(), n) for n in knob_fields)
    chosen = MegatronSettings(attention_backend="sdpa", remove_padding=True)
    assert MegatronConfig.from_settings(chosen, model_path="x").attention_backend == "sdpa"


def test_the_tp_rule_is_megatrons_even_when_the_runtime_holds_vllms(tmp_path) -> None:
    """A checkpoint runtime's view holds the rollout engine's facts: vLLM splits SmolLM2's
    3 KV heads over TP 9 by replicating them, Megatron never does; the handler reads
    Megatron's own rule from the checkpoint the facts name."""
    import transformers

    from xconf.adapters.megatron.handlers import HANDLERS
    from xconf.adapters.models.facts import ModelFacts

    transformers.LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=2,
        num_attention_heads=9,
        num_key_value_heads=3,
        architectures=["LlamaForCausalLM"],
    ).save_pretrained(str(tmp_path))
    facts = ModelFacts(
        config_path=str(tmp_path / "config.json"),
        architecture="LlamaForCausalLM",
        model_type="llama",
        num_layers=2,
        num_heads=9,
        num_kv_heads=3,
        head_dim=64,
        hidden_size=576,
        vocab_size=49152,
        tied_embeddings=False,
        config_dtype="float32",
        transformers_class=True,
        vllm_class=True,
    )
    assert facts.tp_reason(9) is None  # vLLM's rule
    path = TRAINING_TENSOR_PARALLEL_SIZE.path
    view = RuntimeView("vllm-megatron", "cpu", facts)
    app = HANDLERS[path].materialize(KnobRequest(KNOBS[path], "training", 9, {path: 9}, view))
    assert app.status == "unsupported"
    assert "3 KV heads (Megatron replicates none) do not split over TP=9" in app.evidence
    assert "Megatron allows TP 1, 3" in app.evidence
