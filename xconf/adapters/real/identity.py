"""Freezing a recipe identity once: tiny checkpoint, baseline vLLM rollout, frozen tokens.

A recipe identity names the model spec, prompts, response length and sampling seed; its
token fields are empty. Freezing builds (or finds) the checkpoint, runs the baseline
rollout once (float32, eager, no prefix cache, TP 1), and returns a core ``Identity`` with
the frozen tokens and the checkpoint's content digest. The frozen tokens are cached next
to the checkpoint, keyed by the recipe and checkpoint digests, so later runs reuse them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from xconf.adapters.errors import IdentityViolationError
from xconf.adapters.frozen import (
    DEFAULT_PROMPTS,
    FrozenBatch,
    FrozenSample,
    build_identity,
)
from xconf.adapters.models import ModelRecord, ModelSpec, ensure_model
from xconf.canonical import canonical_digest
from xconf.schema import Identity

RECIPE_KIND = "vllm_baseline_rollout"
_RECIPE_KEYS = frozenset(
    {"kind", "model", "prompts", "response_len", "seed", "temperature", "dtype"}
)


def model_spec(options: Mapping[str, Any] | None) -> ModelSpec:
    allowed = {f.name for f in fields(ModelSpec)}
    options = dict(options or {})
    for key in options:
        if key not in allowed:
            raise IdentityViolationError(
                "config.unknown_key",
                f"unknown model option '{key}'",
                f"identity.recipe.model.{key}",
            )
    return ModelSpec(**options)


def parse_recipe(identity: Identity) -> dict[str, Any]:
    recipe = json.loads(identity.recipe)
    if not recipe:
        return {}
    for key in recipe:
        if key not in _RECIPE_KEYS:
            raise IdentityViolationError(
                "config.unknown_key", f"unknown recipe key '{key}'", f"identity.recipe.{key}"
            )
    if recipe.get("kind", RECIPE_KIND) != RECIPE_KIND:
        raise IdentityViolationError(
            "config.invalid_value", f"recipe kind must be '{RECIPE_KIND}'", "identity.recipe.kind"
        )
    return {
        "kind": RECIPE_KIND,
        "model": dict(recipe.get("model") or {}),
        "prompts": list(recipe.get("prompts") or DEFAULT_PROMPTS),
        "response_len": int(recipe.get("response_len", 12)),
        "seed": int(recipe.get("seed", 20260101)),
        "temperature": float(recipe.get("temperature", 1.0)),
        "dtype": str(recipe.get("dtype", "float32")),
    }


def check_declared(identity: Identity, record: ModelRecord) -> None:
    """A declared content digest or tokenizer id must match what was built."""
    declared = identity.checkpoint_id
    actual = f"sha256:{record.checkpoint_sha256}"
    if declared.startswith("sha256:") and declared != actual:
        raise IdentityViolationError(
            "identity.checkpoint_mismatch",
            f"identity declares {declared[:23]}…, the built checkpoint is {actual[:23]}…",
            "identity.checkpoint_id",
        )
    if not record.tokenizer_id.startswith(identity.tokenizer_id):
        raise IdentityViolationError(
            "identity.tokenizer_mismatch",
            f"identity declares tokenizer '{identity.tokenizer_id}', built '{record.tokenizer_id}'",
            "identity.tokenizer_id",
        )


def _cache_file(record: ModelRecord, recipe: Mapping[str, Any]) -> Path:
    key = canonical_digest({"recipe": dict(recipe), "checkpoint": record.checkpoint_sha256})
    return Path(record.path) / "frozen" / f"{key[:24]}.json"


def _load_cached(path: Path) -> FrozenBatch | None:
    try:
        doc = json.loads(path.read_text())
        samples = tuple(
            FrozenSample(tuple(int(t) for t in p), tuple(int(t) for t in r))
            for p, r in zip(doc["prompt_ids"], doc["response_ids"], strict=True)
        )
        return FrozenBatch(samples, int(doc["pad_token_id"]))
    except (OSError, ValueError, KeyError, TypeError, IdentityViolationError):
        return None


def _store(path: Path, batch: FrozenBatch) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "prompt_ids": [list(s.prompt_ids) for s in batch.samples],
        "response_ids": [list(s.response_ids) for s in batch.samples],
        "pad_token_id": batch.pad_token_id,
    }
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


def freeze(
    identity: Identity,
    *,
    default_model: Mapping[str, Any] | None,
    cache_dir: str | None,
    engine_options: Mapping[str, Any],
) -> tuple[Identity, ModelRecord]:
    """The frozen identity and the checkpoint it names (a frozen identity is only checked)."""
    recipe = parse_recipe(identity)
    spec = model_spec({**dict(default_model or {}), **dict(recipe.get("model") or {})})
    record = ensure_model(spec, cache_dir)
    check_declared(identity, record)
    if not recipe:
        FrozenBatch.from_identity(identity)  # validates the layout the scorers need
        return identity, record
    cache = _cache_file(record, recipe)
    batch = _load_cached(cache)
    if batch is None:
        from xconf.adapters.vllm.engine import RolloutEngineConfig, VllmRolloutEngine
        from xconf.adapters.vllm.scorer import generate_responses

        cfg = RolloutEngineConfig(model_path=record.path, dtype=recipe["dtype"], **engine_options)
        with VllmRolloutEngine(cfg) as engine:
            batch = generate_responses(
                engine,
                recipe["prompts"],
                response_len=recipe["response_len"],
                seed=recipe["seed"],
                temperature=recipe["temperature"],
            )
        _store(cache, batch)
    frozen = build_identity(
        batch,
        checkpoint_id=f"sha256:{record.checkpoint_sha256}",
        model_version=record.model_version,
        tokenizer_id=record.tokenizer_id,
        pre_update_state=f"factory weights sha256:{record.checkpoint_sha256} (never updated)",
        scoring_mode=identity.scoring_mode,
        recipe={**recipe, "model_spec_sha256": record.spec_sha256},
        cache_metadata=json.loads(identity.cache_metadata) or None,
    )
    return frozen, record
