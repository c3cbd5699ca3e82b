"""Optional decoding of token ids to text, only from tokenizers that load locally.

Nothing is downloaded and nothing is unpickled: a tokenizer is used only when the
identity's ``tokenizer_id`` names a local directory (or file) holding ``tokenizer.json``
or ``vocab.json``, or an ``org/name`` already in the local Hugging Face hub cache.
With the ``tokenizers`` library installed, ``tokenizer.json`` is decoded by it;
otherwise the vocabulary is read from the JSON directly.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from xconf.errors import XconfError
from xconf.shown_text import shown

TokenDecoder = Callable[[int], str]
DecoderFactory = Callable[[Mapping[str, Any]], TokenDecoder | None]


def tokenizer_id(identity: Mapping[str, Any]) -> str | None:
    """``tokenizer_id`` at the top of the identity record or one level down."""
    value = identity.get("tokenizer_id")
    if isinstance(value, str):
        return value
    for key in ("identity", "record", "tokenizer"):
        nested = identity.get(key)
        if isinstance(nested, dict):
            found = tokenizer_id(nested)
            if found:
                return found
    return None


def _hub_snapshots(name: str) -> list[Path]:
    """Snapshots of ``org/name`` already in the local Hugging Face cache (never fetched)."""
    if name.count("/") != 1 or name.startswith((".", "/")):
        return []
    home = os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME") or os.path.join(Path.home(), ".cache", "huggingface"), "hub"
    )
    snapshots = Path(home) / ("models--" + name.replace("/", "--")) / "snapshots"
    return sorted(snapshots.iterdir()) if snapshots.is_dir() else []


def _candidates(name: str, run_dir: Path) -> list[Path]:
    path = Path(name)
    bases = [path] if path.is_absolute() else [run_dir / path, Path.cwd() / path]
    bases += _hub_snapshots(name)
    out = []
    for base in bases:
        if base.is_dir():
            out += [base / "tokenizer.json", base / "vocab.json"]
        elif base.suffix == ".json":
            out.append(base)
    return [p for p in out if p.is_file()]


def _vocab_decoder(vocab: Any) -> TokenDecoder | None:
    table: dict[int, str] = {}
    if isinstance(vocab, dict):
        table = {int(i): str(t) for t, i in vocab.items() if isinstance(i, int)}
    elif isinstance(vocab, list):  # Unigram: [[piece, score], ...]
        table = {i: str(e[0]) for i, e in enumerate(vocab) if isinstance(e, list) and e}
    if not table:
        return None
    return lambda token_id: table[token_id]


def load_decoder(path: Path) -> TokenDecoder | None:
    """A decoder for one local ``tokenizer.json`` / ``vocab.json`` file, or ``None``. The
    path comes from the run directory: the file is read once, bounded, from a regular file
    (a FIFO or a device named there is never waited on or read), and parsed from those bytes."""
    from xconf.adapters.errors import ModelFactoryError
    from xconf.adapters.models.facts import read_checkpoint_bytes
    from xconf.artifacts.layout import parse_json
    from xconf.errors import ArtifactError

    try:
        data = read_checkpoint_bytes(path)
    except ModelFactoryError:
        return None
    if data is None:
        return None
    if path.name == "tokenizer.json":
        try:
            from tokenizers import Tokenizer
        except ImportError:
            pass
        else:
            try:
                tok = Tokenizer.from_str(data.decode("utf-8"))
            except Exception:
                tok = None  # not loadable by the library: fall back to its vocabulary below
            if tok is not None:
                return lambda token_id: tok.decode([token_id], skip_special_tokens=False)
    try:
        document = parse_json(data, path.name, str(path))
    except ArtifactError:
        return None
    if isinstance(document, dict) and isinstance(document.get("model"), dict):
        added = {
            int(t["id"]): str(t["content"])
            for t in document.get("added_tokens") or []
            if isinstance(t, dict) and isinstance(t.get("id"), int)
        }
        base = _vocab_decoder(document["model"].get("vocab"))
        if base is None:
            return None
        return lambda token_id: added[token_id] if token_id in added else base(token_id)
    return _vocab_decoder(document)


def _recorded_dirs(identity: Mapping[str, Any], name: str) -> list[Path]:
    """Where the run said its tokenizer is: the recipe of a user checkpoint, or the xconf
    model cache holding the tiny model whose manifest names this tokenizer id."""
    out: list[Path] = []
    recipe = identity.get("recipe")
    if isinstance(recipe, Mapping) and isinstance(recipe.get("tokenizer_path"), str):
        out.append(Path(recipe["tokenizer_path"]))
    root = Path(os.environ.get("XCONF_MODEL_CACHE") or Path.home() / ".cache" / "xconf" / "models")
    model = recipe.get("model") if isinstance(recipe, Mapping) else None
    if isinstance(model, Mapping) and isinstance(model.get("pretrained"), str):
        out.extend(sorted(root.glob("pretrained/*")))  # the converted pretrained default
    if name.startswith("xconf-bpe."):
        from xconf.adapters.models.facts import read_checkpoint_json

        for manifest in sorted(root.glob("*/xconf_model.json")) if root.is_dir() else []:
            try:
                record = read_checkpoint_json(manifest).get("record", {})
            except (AttributeError, XconfError):
                continue
            if isinstance(record, dict) and record.get("tokenizer_id") == name:
                out.append(manifest.parent)
    return [p / "tokenizer.json" for p in out if (p / "tokenizer.json").is_file()]


def default_decoder_factory(run_dir: Path, tokenizer: Path | None = None) -> DecoderFactory:
    """Decoders by tokenizer id; ``tokenizer`` (``xconf report --tokenizer``) wins."""
    cache: dict[str, TokenDecoder | None] = {}
    forced = None
    if tokenizer is not None:
        forced = next(
            (d for d in map(load_decoder, _candidates(str(tokenizer), run_dir)) if d), None
        )

    def factory(identity: Mapping[str, Any]) -> TokenDecoder | None:
        if forced is not None:
            return forced
        name = tokenizer_id(identity)
        if not name:
            return None
        if name not in cache:
            files = _candidates(name, run_dir) + _recorded_dirs(identity, name)
            cache[name] = next((d for d in map(load_decoder, files) if d), None)
        return cache[name]

    def shown_factory(identity: Mapping[str, Any]) -> TokenDecoder | None:
        # A token's text is the model's: control and bidi characters shown escaped.
        decoder = factory(identity)
        return None if decoder is None else (lambda token_id: shown(decoder(token_id)))

    return shown_factory
