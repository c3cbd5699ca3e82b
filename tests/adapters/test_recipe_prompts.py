"""The recipe's shared system prompt: parsed, keyed, refused when malformed, long enough."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from tests.adapters.conftest import needs_hf
from tests.adapters.test_runtime_s2 import _spec
from xconf.adapters.checkpoint.identity import inline_prompts, parse_recipe
from xconf.adapters.errors import IdentityViolationError
from xconf.canonical import canonical_json

CPU_BLOCK = 128  # vLLM 0.32's default KV block on CPU (vllm/platforms/cpu.py)


def _with_recipe(**changes: Any) -> Any:
    identity = _spec([]).identity
    recipe = {**json.loads(identity.recipe), **changes}
    recipe = {k: v for k, v in recipe.items() if v is not ...}
    return replace(identity, recipe=canonical_json(recipe))


def test_system_prompt_goes_before_every_inline_prompt() -> None:
    recipe = parse_recipe(_spec([]).identity)
    system = recipe["system_prompt"]
    assert system.endswith("log-probability.\n")
    assert inline_prompts(recipe) == [system + p for p in recipe["prompts"]]


def test_no_or_empty_system_prompt_keeps_the_recipe_as_it_was() -> None:
    # The parsed recipe keys the frozen-token cache: recipes without a system prompt keep theirs.
    without = parse_recipe(_with_recipe(system_prompt=...))
    empty = parse_recipe(_with_recipe(system_prompt=""))
    assert "system_prompt" not in without and without == empty
    assert inline_prompts(without) == without["prompts"]


def test_a_non_string_system_prompt_is_a_coded_error() -> None:
    with pytest.raises(IdentityViolationError) as err:
        parse_recipe(_with_recipe(system_prompt=["not", "text"]))
    assert err.value.code == "config.wrong_type"
    assert err.value.path == "identity.recipe.system_prompt"


@needs_hf
def test_s2_system_prompt_fills_a_whole_kv_block(model_record: Any) -> None:
    """Prefix caching on S2 is measurable only if every prompt spans more than one block."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_record.path)
    recipe = parse_recipe(_spec([]).identity)
    system = tok(recipe["system_prompt"], add_special_tokens=False)["input_ids"]
    assert len(system) > CPU_BLOCK
    for prompt in inline_prompts(recipe):
        ids = tok(prompt, add_special_tokens=False)["input_ids"]
        # The first block is the same tokens in every prompt: one cached block serves all.
        assert ids[:CPU_BLOCK] == system[:CPU_BLOCK]
        assert len(ids) <= 256 - recipe["response_len"]  # within max_model_len
