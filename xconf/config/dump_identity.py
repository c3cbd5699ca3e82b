"""A dumped training step as the frozen identity (``identity=from_dump identity.dump=FILE``).

The config names the file and, optionally, renamed batch keys; parsing turns them into the
identity's recipe (kind ``from_dump``) with the file's absolute path and its SHA-256, so the
plan's identity digest and every case id change with the dump's bytes. The tensors are read
by the runtime when it freezes the identity (:mod:`xconf.adapters.frozen_dump`); nothing
here imports a tensor library, so planning stays cheap.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from xconf.artifacts.layout import input_budget, sha256_file
from xconf.errors import ArtifactError, ConfigError

DUMP_KIND = "from_dump"
# verl's batch keys (``DataProto.batch``): ``input_ids`` is ``prompts`` then ``responses``.
DEFAULT_KEYS: dict[str, str] = {
    "input_ids": "input_ids",
    "prompts": "prompts",
    "responses": "responses",
    "attention_mask": "attention_mask",
    "response_mask": "response_mask",
    "position_ids": "position_ids",
}
RECIPE_KEYS = frozenset({"kind", "dump", "sha256", "keys", "model", "tokenizer_path"})


def _keys(node: Any) -> dict[str, str]:
    if node is None:
        return dict(DEFAULT_KEYS)
    if not isinstance(node, Mapping):
        raise ConfigError("config.wrong_type", "expected a mapping", "identity.dump_keys")
    keys = dict(DEFAULT_KEYS)
    for name, value in node.items():
        where = f"identity.dump_keys.{name}"
        if name not in DEFAULT_KEYS:
            raise ConfigError(
                "config.unknown_key",
                f"unknown dump key '{name}' (known: {', '.join(DEFAULT_KEYS)})",
                where,
            )
        if not isinstance(value, str) or not value:
            raise ConfigError("config.wrong_type", "a key name is a non-empty string", where)
        keys[str(name)] = value
    return keys


def dump_recipe(dump: Any, dump_keys: Any, recipe: Mapping[str, Any]) -> dict[str, Any]:
    """The from-dump recipe: the file's absolute path, its digest and the batch keys."""
    for key in recipe:
        if key not in RECIPE_KEYS:
            raise ConfigError(
                "config.unknown_key", f"unknown recipe key '{key}'", f"identity.recipe.{key}"
            )
    if recipe.get("kind", DUMP_KIND) != DUMP_KIND:
        raise ConfigError(
            "config.invalid_value",
            f"identity.dump needs the from_dump identity (identity=from_dump), not a "
            f"'{recipe.get('kind')}' recipe",
            "identity.dump",
        )
    if not isinstance(dump, str) or not dump:
        raise ConfigError(
            "config.missing_key",
            "name the dumped step to replay: identity.dump=FILE (.safetensors, .npz, .parquet)",
            "identity.dump",
        )
    path = Path(dump).expanduser().resolve()
    if not path.exists():  # anything else but a regular file is refused by the digest's open
        raise ConfigError("identity.dump_missing", f"dump file {path} does not exist", str(path))
    try:
        # The same digest as judge's (xconf/judge/formats.py read_once): the whole file's,
        # of a regular file within the one input budget (a 200 GB file is refused unread).
        digest = sha256_file(path, limit=input_budget(), follow=True)
    except ArtifactError as exc:
        code = "identity.dump_too_large" if exc.code == "artifacts.too_large" else None
        raise ConfigError(code or "identity.dump_unreadable", exc.message, str(path)) from exc
    except OSError as exc:
        raise ConfigError("identity.dump_unreadable", str(exc), str(path)) from exc
    if recipe.get("sha256") not in (None, digest):
        raise ConfigError(
            "identity.dump_changed",
            f"the identity was frozen from sha256:{str(recipe['sha256'])[:12]}…, the file is "
            f"now sha256:{digest[:12]}…",
            str(path),
        )
    model = recipe.get("model") or {}
    if not isinstance(model, Mapping):
        raise ConfigError("config.wrong_type", "expected a mapping", "identity.recipe.model")
    out: dict[str, Any] = {
        **dict(recipe),
        "kind": DUMP_KIND,
        "dump": str(path),
        "sha256": digest,
        "keys": _keys(dump_keys if dump_keys is not None else recipe.get("keys")),
        "model": dict(model),
    }
    return out
