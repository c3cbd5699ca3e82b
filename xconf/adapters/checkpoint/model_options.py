"""The real runtimes' model options: a tiny factory model or the user's own checkpoint.

``runtime.model`` is either ModelSpec fields (a tiny model built locally) or ``path`` to a
Hugging Face checkpoint directory; the identity recipe's ``model`` may instead name the
real pretrained default (``{pretrained: smollm2-135m-instruct}``, converted once from its
packaged GGUF: :mod:`xconf.adapters.models.pretrained`); ``runtime.tokenizer.path``
defaults to the model directory; ``runtime.trust_remote_code`` stays false unless asked.
Every bad option is a coded :class:`ConfigError` naming the key, raised before anything is
built or written.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from xconf.adapters.models import ModelRecord, ModelSpec, ensure_model, open_checkpoint
from xconf.adapters.models.factory import model_spec
from xconf.errors import ConfigError

_SPEC_KEYS = frozenset(f.name for f in fields(ModelSpec))
_TOKENIZER_KEYS = frozenset({"path"})


@dataclass(frozen=True)
class ModelOptions:
    path: str | None = None
    spec: Mapping[str, Any] = field(default_factory=dict)
    tokenizer_path: str | None = None
    trust_remote_code: bool = False

    @property
    def local(self) -> bool:
        return self.path is not None

    def record(self, recipe_model: Mapping[str, Any], cache_dir: str | None) -> ModelRecord:
        """The checkpoint every case scores: the user's directory, or a built tiny model."""
        if self.path is not None:
            return open_checkpoint(
                self.path,
                self.tokenizer_path,
                trust_remote_code=self.trust_remote_code,
                cache_dir=cache_dir,
            )
        if "pretrained" in recipe_model:
            return _pretrained(recipe_model, self.spec, cache_dir)
        spec: ModelSpec = model_spec({**dict(self.spec), **dict(recipe_model)})
        return ensure_model(spec, cache_dir)


def _pretrained(
    recipe_model: Mapping[str, Any], spec: Mapping[str, Any], cache_dir: str | None
) -> ModelRecord:
    from xconf.adapters.models.pretrained import NAME, open_pretrained

    name = recipe_model["pretrained"]
    if name != NAME:
        raise ConfigError(
            "config.invalid_value",
            f"unknown pretrained model {name!r} (the one shipped is '{NAME}')",
            "identity.recipe.model.pretrained",
        )
    others = sorted(set(recipe_model) - {"pretrained"}) + sorted(spec)
    if others:
        raise ConfigError(
            "config.conflict",
            "a pretrained model takes no tiny-model fields",
            f"identity.recipe.model.{others[0]}",
        )
    return open_pretrained(cache_dir)


def _mapping(node: Any, where: str) -> dict[str, Any]:
    if node is None:
        return {}
    if not isinstance(node, Mapping):
        raise ConfigError("config.wrong_type", "expected a mapping", where)
    return dict(node)


def _path(value: Any, where: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str | Path) or not str(value):
        raise ConfigError("config.wrong_type", "expected a directory path", where)
    return str(Path(str(value)).expanduser())


def parse_model_options(model: Any, tokenizer: Any, trust_remote_code: Any) -> ModelOptions:
    model_map = _mapping(model, "runtime.model")
    tok_map = _mapping(tokenizer, "runtime.tokenizer")
    for key in model_map:
        if key != "path" and key not in _SPEC_KEYS:
            raise ConfigError(
                "config.unknown_key",
                f"unknown model option '{key}' (path, or tiny-model fields "
                f"{', '.join(sorted(_SPEC_KEYS))})",
                f"runtime.model.{key}",
            )
    for key in tok_map:
        if key not in _TOKENIZER_KEYS:
            raise ConfigError(
                "config.unknown_key",
                f"unknown tokenizer option '{key}'",
                f"runtime.tokenizer.{key}",
            )
    path = _path(model_map.pop("path", None), "runtime.model.path")
    spec = {k: v for k, v in model_map.items() if v is not None}
    if path is not None and spec:
        first = sorted(spec)[0]
        raise ConfigError(
            "config.conflict",
            "runtime.model.path names a checkpoint; tiny-model fields do not apply to it",
            f"runtime.model.{first}",
        )
    tok_path = _path(tok_map.get("path"), "runtime.tokenizer.path")
    if tok_path is not None and path is None:
        raise ConfigError(
            "config.conflict",
            "runtime.tokenizer.path needs runtime.model.path (a tiny model has its own tokenizer)",
            "runtime.tokenizer.path",
        )
    if not isinstance(trust_remote_code, bool):
        raise ConfigError(
            "config.wrong_type", "expected true or false", "runtime.trust_remote_code"
        )
    return ModelOptions(path, spec, tok_path, trust_remote_code)


def reject_unknown(options: Mapping[str, Any]) -> None:
    """Runtime options the real runtimes do not have (``+runtime.model_path=...``)."""
    for key in sorted(options):
        hint = " (a checkpoint directory is runtime.model.path)" if "path" in key else ""
        raise ConfigError(
            "runtime.unknown_option", f"unknown runtime option '{key}'{hint}", f"runtime.{key}"
        )
