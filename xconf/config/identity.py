"""Strict parsing of the frozen scoring identity."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from xconf.canonical import canonical_json
from xconf.config.dump_identity import DUMP_KIND, dump_recipe
from xconf.errors import ConfigError
from xconf.experiment import Identity

TOKEN_FIELDS = ("token_ids", "selected_token_ids", "active_mask", "attention_mask", "position_ids")
MASK_FIELDS = frozenset({"active_mask", "attention_mask"})
STRING_FIELDS = (
    "checkpoint_id",
    "model_version",
    "tokenizer_id",
    "tokenizer_policy",
    "pre_update_state",
)
JSON_FIELDS = ("cache_metadata", "packing_metadata", "recipe")
# ``dump`` / ``dump_keys``: a dumped step replayed as the frozen identity (config/dump_identity.py).
DUMP_FIELDS = ("dump", "dump_keys")
IDENTITY_KEYS = frozenset(
    (*TOKEN_FIELDS, *STRING_FIELDS, *JSON_FIELDS, *DUMP_FIELDS, "scoring_mode")
)
MAX_TOKENS = 1_000_000
# Token ids and positions fit the int32 every engine indexes with (no vocabulary is larger).
MAX_ID = 2**31 - 1


def _rows(node: Any, field: str) -> tuple[tuple[int, ...], ...]:
    path = f"identity.{field}"
    if not isinstance(node, list | tuple):
        raise ConfigError("config.wrong_type", "expected a list of rows", path)
    rows = []
    total = 0
    for i, row in enumerate(node):
        if not isinstance(row, list | tuple):
            raise ConfigError("config.wrong_type", "each row must be a list", f"{path}[{i}]")
        total += len(row)
        if total > MAX_TOKENS:
            raise ConfigError("config.too_large", f"more than {MAX_TOKENS} tokens", path)
        values = []
        for j, value in enumerate(row):
            if isinstance(value, bool) and field in MASK_FIELDS:
                value = int(value)  # a mask entry may be written true/false
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(
                    "config.wrong_type", f"expected an integer, got {value!r}", f"{path}[{i}][{j}]"
                )
            if field in MASK_FIELDS and value not in (0, 1):
                raise ConfigError(
                    "config.invalid_value", "mask entries are 0 or 1", f"{path}[{i}][{j}]"
                )
            if field not in MASK_FIELDS and value < 0:
                what = "positions" if field == "position_ids" else "token ids"
                raise ConfigError(
                    "config.invalid_value", f"{what} are non-negative", f"{path}[{i}][{j}]"
                )
            if value > MAX_ID:
                raise ConfigError(
                    "config.invalid_value",
                    f"{value} is beyond any vocabulary or context ({MAX_ID})",
                    f"{path}[{i}][{j}]",
                )
            values.append(value)
        rows.append(tuple(values))
    return tuple(rows)


# The contract's identity lists them: a frozen input says how caches and packing were used.
REQUIRED_JSON_FIELDS = frozenset({"cache_metadata", "packing_metadata"})


def _json_field(node: Any, field: str) -> str:
    if node is None and field in REQUIRED_JSON_FIELDS:
        raise ConfigError(
            "config.missing_key",
            f"{field} is required (a mapping; {{}} when there is nothing to declare)",
            f"identity.{field}",
        )
    if node is None:
        node = {}
    if not isinstance(node, Mapping):
        raise ConfigError("config.wrong_type", "expected a mapping", f"identity.{field}")
    try:
        return canonical_json(node, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ConfigError("config.wrong_type", str(exc), f"identity.{field}") from exc


def parse_identity(node: Any) -> Identity:
    if not isinstance(node, Mapping):
        raise ConfigError("config.wrong_type", "identity must be a mapping", "identity")
    for key in node:
        if key not in IDENTITY_KEYS:
            raise ConfigError(
                "config.unknown_key", f"unknown identity key '{key}'", f"identity.{key}"
            )
    strings = {}
    for field in STRING_FIELDS:
        value = node.get(field)
        if not isinstance(value, str) or not value:
            raise ConfigError(
                "config.missing_key", "a non-empty string is required", f"identity.{field}"
            )
        strings[field] = value
    recipe_node = node.get("recipe")
    if any(node.get(k) is not None for k in DUMP_FIELDS) or (
        isinstance(recipe_node, Mapping) and recipe_node.get("kind") == DUMP_KIND
    ):
        # A frozen identity (identity.json of a replayed run) names its dump in the recipe.
        frozen_dump = recipe_node.get("dump") if isinstance(recipe_node, Mapping) else None
        dump = node.get("dump") if node.get("dump") is not None else frozen_dump
        recipe_node = dump_recipe(dump, node.get("dump_keys"), recipe_node or {})
    recipe = _json_field(recipe_node, "recipe")
    rows = {field: _rows(node.get(field, []), field) for field in TOKEN_FIELDS}
    if recipe == "{}":
        _check_shapes(rows)
    mode = node.get("scoring_mode", "decode")
    if mode not in ("decode", "prefill"):
        raise ConfigError(
            "config.invalid_value", "scoring_mode is decode or prefill", "identity.scoring_mode"
        )
    return Identity(
        checkpoint_id=strings["checkpoint_id"],
        model_version=strings["model_version"],
        tokenizer_id=strings["tokenizer_id"],
        tokenizer_policy=strings["tokenizer_policy"],
        pre_update_state=strings["pre_update_state"],
        token_ids=rows["token_ids"],
        selected_token_ids=rows["selected_token_ids"],
        active_mask=rows["active_mask"],
        attention_mask=rows["attention_mask"],
        position_ids=rows["position_ids"],
        cache_metadata=_json_field(node.get("cache_metadata"), "cache_metadata"),
        packing_metadata=_json_field(node.get("packing_metadata"), "packing_metadata"),
        scoring_mode=mode,
        recipe=recipe,
    )


def _check_shapes(rows: Mapping[str, tuple[tuple[int, ...], ...]]) -> None:
    """Every token-level field must have the same row count and row lengths."""
    reference = rows["token_ids"]
    if not reference:
        raise ConfigError(
            "config.missing_key", "identity needs at least one sample", "identity.token_ids"
        )
    shape = [len(r) for r in reference]
    for i, length in enumerate(shape):
        if length == 0:  # nothing to score, and engines loop over the row's tokens
            raise ConfigError(
                "config.invalid_value",
                "a sample needs at least one token",
                f"identity.token_ids[{i}]",
            )
    for field in TOKEN_FIELDS[1:]:
        if [len(r) for r in rows[field]] != shape:
            raise ConfigError(
                "config.identity_shape",
                f"{field} must have the same shape as token_ids ({len(shape)} rows)",
                f"identity.{field}",
            )
