"""Freezing a recipe identity once: tiny checkpoint, baseline vLLM rollout, frozen tokens.

A recipe identity names the model spec, prompts, response length and sampling seed; its
token fields are empty. Freezing builds (or finds) the checkpoint, runs the baseline
rollout once (float32, eager, no prefix cache, TP 1), and returns a core ``Identity`` with
the frozen tokens and the checkpoint's content digest. The frozen tokens are cached next
to the checkpoint, keyed by the recipe and checkpoint digests, so later runs reuse them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xconf.adapters.checkpoint.dataset import (
    DatasetOptions,
    generate_from_ids,
    load_prompt_ids,
    load_tokenizer,
    parse_dataset,
)
from xconf.adapters.errors import IdentityViolationError
from xconf.adapters.frozen import (
    DEFAULT_PROMPTS,
    FrozenBatch,
    build_identity,
)
from xconf.adapters.frozen_dump import dump_recipe, freeze_dump
from xconf.adapters.models import ModelRecord, default_cache_dir
from xconf.artifacts.layout import read_cache_entry
from xconf.artifacts.safe_io import write_cache_entry
from xconf.canonical import canonical_digest
from xconf.experiment import Identity

if TYPE_CHECKING:
    from xconf.adapters.checkpoint.model_options import ModelOptions

RECIPE_KIND = "vllm_baseline_rollout"
MAX_FROZEN_BYTES = 256 << 20
_RECIPE_KEYS = frozenset(
    {
        "kind",
        "model",
        "prompts",
        "system_prompt",
        "response_len",
        "seed",
        "temperature",
        "dtype",
        "dataset",
        "update",
    }
)


def thaw_recipe(frozen: Mapping[str, Any]) -> dict[str, Any]:
    """The recipe a frozen identity was frozen from: the keys :func:`freeze` adds (the spec
    digest, where the tokenizer is, the dataset file's digest) removed, so freezing it again
    (``xconf localize``) parses as the experiment's own recipe did and gives the same tokens."""
    recipe = {k: v for k, v in frozen.items() if k not in ("model_spec_sha256", "tokenizer_path")}
    dataset = recipe.get("dataset")
    if isinstance(dataset, Mapping):
        # The file is digested again when it is parsed: a changed file is new frozen tokens.
        recipe["dataset"] = {k: v for k, v in dataset.items() if k != "sha256"}
    return recipe


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
    parsed: dict[str, Any] = {
        "kind": RECIPE_KIND,
        "model": dict(recipe.get("model") or {}),
        "prompts": list(recipe.get("prompts") or DEFAULT_PROMPTS),
        "response_len": int(recipe.get("response_len", 12)),
        "seed": int(recipe.get("seed", 20260101)),
        "temperature": float(recipe.get("temperature", 1.0)),
        "dtype": str(recipe.get("dtype", "float32")),
    }
    system = recipe.get("system_prompt")
    if system is not None and not isinstance(system, str):
        raise IdentityViolationError(
            "config.wrong_type", "expected a string", "identity.recipe.system_prompt"
        )
    if system:  # absent when empty: recipes without one keep their frozen-token cache key
        parsed["system_prompt"] = system
    if "update" in recipe:  # one optimizer step after freezing: every case scores W1
        from xconf.adapters.hf.update_step import parse_step

        rule = parse_step(recipe["update"])
        parsed["update"] = {"optimizer": rule.optimizer, "lr": rule.lr, "loss": rule.loss}
    dataset = parse_dataset(recipe.get("dataset"), parsed)
    if dataset is not None:
        # The dataset replaces the inline prompts (and their shared system prompt); its
        # digest keys the frozen tokens.
        parsed["prompts"] = []
        parsed.pop("system_prompt", None)
        parsed["dataset"] = dataset.to_dict()
    return parsed


def inline_prompts(recipe: Mapping[str, Any]) -> list[str]:
    """The prompts the baseline rollout samples from: each behind the shared system prompt."""
    system = str(recipe.get("system_prompt") or "")
    return [system + prompt for prompt in recipe["prompts"]]


def _dataset(recipe: Mapping[str, Any]) -> DatasetOptions | None:
    node = recipe.get("dataset")
    return DatasetOptions(**node) if node else None


def check_declared(identity: Identity, record: ModelRecord) -> None:
    """A declared content digest or tokenizer id must match what was built.

    For a user's checkpoint (``runtime.model.path``) only ``sha256:`` declarations are
    checked: the experiment's names describe the tiny model it ships with, and the frozen
    identity records the user checkpoint's own digests.
    """
    declared = identity.checkpoint_id
    actual = f"sha256:{record.checkpoint_sha256}"
    if declared.startswith("sha256:") and declared != actual:
        raise IdentityViolationError(
            "identity.checkpoint_mismatch",
            f"identity declares {declared[:23]}…, the built checkpoint is {actual[:23]}…",
            "identity.checkpoint_id",
        )
    declared_tok = identity.tokenizer_id
    if record.local and not declared_tok.startswith("sha256:"):
        return
    if not record.tokenizer_id.startswith(declared_tok):
        raise IdentityViolationError(
            "identity.tokenizer_mismatch",
            f"identity declares tokenizer '{identity.tokenizer_id}', built '{record.tokenizer_id}'",
            "identity.tokenizer_id",
        )


def _cache_area(cache_dir: str | None, name: str) -> Path:
    """A folder of the model cache that freezing owns (frozen tokens, one-step checkpoints)."""
    return (Path(cache_dir).expanduser() if cache_dir else default_cache_dir()) / name


def _cache_file(
    record: ModelRecord, recipe: Mapping[str, Any], cache_dir: str | None
) -> tuple[Path, str]:
    """Where the recipe's frozen tokens are cached, and the key the entry must hold."""
    key = canonical_digest({"recipe": dict(recipe), "checkpoint": record.checkpoint_sha256})
    # Never write into a user's checkpoint directory: its frozen tokens live in the cache.
    root = _cache_area(cache_dir, "frozen")
    return (root if record.local else Path(record.path) / "frozen") / f"{key[:24]}.json", key


def _tokenizer_dir(record: ModelRecord) -> str:
    return record.tokenizer_path or record.path


def check_recipe(
    identity: Identity,
    model: ModelOptions,
    cache_dir: str | None,
    local_record: ModelRecord | None,
    max_model_len: int,
) -> ModelRecord:
    """Parse the recipe, check the checkpoint and every dataset row now, before a run writes
    anything; returns the checkpoint every case scores."""
    dumped = dump_recipe(identity)
    if dumped is not None:  # a dumped step: every token checked against the checkpoint now
        dump_record = local_record or model.record(dumped.model, cache_dir)
        freeze_dump(identity, dumped, dump_record, max_model_len)
        return dump_record
    recipe = parse_recipe(identity)
    # The checkpoint too (a user's directory was checked when the runtime was built; the
    # packaged pretrained default is converted and checked here).
    record = local_record or model.record(recipe.get("model") or {}, cache_dir)
    dataset = _dataset(recipe)
    if dataset is not None:
        tok = load_tokenizer(_tokenizer_dir(record), model.trust_remote_code)
        load_prompt_ids(dataset, tok, record.vocab_size, max_model_len)
    return record


def _load_cached(path: Path, key: str, vocab_size: int) -> FrozenBatch | None:
    """The cached samples when the entry is the user's own file, of exactly this recipe and
    checkpoint (``key``), unaltered (:meth:`FrozenBatch.from_cache`); else None: sample."""
    data = read_cache_entry(path, MAX_FROZEN_BYTES)
    return None if data is None else FrozenBatch.from_cache(data, key, vocab_size)


def _store(path: Path, batch: FrozenBatch, key: str) -> None:
    # A cache that cannot be written (read-only, another user's) costs time, never the run.
    write_cache_entry(path, batch.cache_bytes(key))


@dataclass(frozen=True)
class FrozenCheckpoint:
    """What freezing gives the runtime: the identity, the checkpoint every case scores, and,
    for a one-step identity, the pre-update checkpoint W0 (the weights a synced rollout
    engine holds before the sync, as an RL loop's engine does)."""

    identity: Identity
    record: ModelRecord
    pre_update: ModelRecord | None = None


def freeze(
    identity: Identity,
    *,
    model: ModelOptions,
    cache_dir: str | None,
    engine_options: Mapping[str, Any],
    local_record: ModelRecord | None = None,
) -> FrozenCheckpoint:
    """The frozen identity and the checkpoint it names (a frozen identity is only checked)."""
    dumped = dump_recipe(identity)
    if dumped is not None:  # a dumped step's own tokens: no rollout, nothing sampled
        dump_record = local_record or model.record(dumped.model, cache_dir)
        limit = int(engine_options["max_model_len"])
        return FrozenCheckpoint(freeze_dump(identity, dumped, dump_record, limit), dump_record)
    recipe = parse_recipe(identity)
    record = local_record or model.record(recipe.get("model") or {}, cache_dir)
    check_declared(identity, record)
    if not recipe:
        FrozenBatch.from_identity(identity)  # validates the layout the scorers need
        return FrozenCheckpoint(identity, record)
    if local_record is None and "pretrained" in recipe["model"]:
        pass  # the recipe names the packaged model; its digest is the checkpoint id
    elif record.local:
        # The tiny-model spec does not apply; where the tokenizer is lets the report show text.
        recipe = {
            **recipe,
            "model": {"checkpoint": "local"},
            "tokenizer_path": record.tokenizer_path or record.path,
        }
    # The tokens are sampled at W0 whether or not a step follows: a one-step identity scores
    # the very tokens its no-step twin scores (the drift before and after, on one input).
    cache, key = _cache_file(record, {k: v for k, v in recipe.items() if k != "update"}, cache_dir)
    batch = _load_cached(cache, key, record.vocab_size)
    if batch is None:
        from xconf.adapters.vllm.engine import RolloutEngineConfig, VllmRolloutEngine
        from xconf.adapters.vllm.scorer import generate_responses

        cfg = RolloutEngineConfig(
            model_path=record.path,
            dtype=recipe["dtype"],
            tokenizer_path=record.tokenizer_path,
            trust_remote_code=model.trust_remote_code,
            **engine_options,
        )
        dataset = _dataset(recipe)
        with VllmRolloutEngine(cfg) as engine:
            if dataset is not None:
                prompts = load_prompt_ids(
                    dataset, engine.tokenizer, record.vocab_size, cfg.max_model_len
                )
                batch = generate_from_ids(engine, prompts, dataset)
            else:
                batch = generate_responses(
                    engine,
                    inline_prompts(recipe),
                    response_len=recipe["response_len"],
                    seed=recipe["seed"],
                    temperature=recipe["temperature"],
                )
        _store(cache, batch, key)
    scored, pre_update = record, None
    state = f"factory weights sha256:{record.checkpoint_sha256} (never updated)"
    if "update" in recipe:
        scored, state = _one_step(record, batch, recipe["update"], model, cache_dir)
        pre_update = record
    frozen = build_identity(
        batch,
        checkpoint_id=f"sha256:{scored.checkpoint_sha256}",
        model_version=scored.model_version,
        tokenizer_id=record.tokenizer_id,
        pre_update_state=state,
        scoring_mode=identity.scoring_mode,
        recipe={**recipe, "model_spec_sha256": record.spec_sha256},
        cache_metadata=json.loads(identity.cache_metadata) or None,
    )
    return FrozenCheckpoint(frozen, scored, pre_update)


def _one_step(
    w0: ModelRecord,
    batch: FrozenBatch,
    rule_node: Mapping[str, Any],
    model: ModelOptions,
    cache_dir: str | None,
) -> tuple[ModelRecord, str]:
    """W1: one recorded optimizer step from W0 on the frozen tokens (``update_step.py``),
    in the model cache, opened and digested as any local checkpoint; and the identity's
    ``pre_update_state`` (W0's digest, the rule, the tokens' digest and W1's digest)."""
    from xconf.adapters.hf.update_step import parse_step, take_step
    from xconf.adapters.models.local import open_checkpoint

    root = _cache_area(cache_dir, "one-step")
    step = take_step(Path(w0.path), batch.layout(), parse_step(rule_node), root)
    w1 = open_checkpoint(
        step.path,
        w0.tokenizer_path,  # None: W1 holds byte copies of W0's tokenizer files
        trust_remote_code=model.trust_remote_code,
        cache_dir=cache_dir,
    )
    return w1, step.pre_update_state
