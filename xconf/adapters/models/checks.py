"""A checkpoint's files checked against each other before anything is built or written.

``check_checkpoint(root, tok_root, facts, weight_files, trust_remote_code)`` reads only file
headers and JSON (nothing is unpickled, no weights are loaded):

- every safetensors file: an 8-byte header length that fits the file (and a sane bound),
  a JSON header whose tensors have known dtypes, shapes and data offsets that match their
  sizes and tile the data section up to the end of the file (a truncated or padded file,
  a dtype that lies about the byte count, a pickle renamed ``.safetensors``);
- tensor names and shapes against the model transformers builds from the config (on the
  meta device: no memory, no initialisation);
- the tokenizer: it loads, asks for no checkpoint code (``auto_map``) unless allowed, and
  its token ids fit the config's vocabulary.

Every failure is a coded :class:`ModelFactoryError` naming the file (and tensor or field).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from xconf.adapters.errors import ModelFactoryError
from xconf.adapters.models.facts import ModelFacts, read_checkpoint_bytes, read_checkpoint_json
from xconf.artifacts.layout import UNBOUNDED, open_regular
from xconf.artifacts.safetensors_header import header_length, parse_header
from xconf.errors import ArtifactError

_PICKLE_MAGIC = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05", b"PK\x03\x04")


def _error(code: str, message: str, where: Path | str) -> ModelFactoryError:
    return ModelFactoryError(code, message, str(where))


def read_header(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Tensor name -> (dtype, shape) from one safetensors file, every offset checked (the
    one header parser: :mod:`xconf.artifacts.safetensors_header`), the data tiled exactly."""
    try:
        with open_regular(path, UNBOUNDED, follow=True) as fd:
            size = os.fstat(fd).st_size
            head = os.pread(fd, 8, 0)
            if head.startswith(_PICKLE_MAGIC):
                raise _error(
                    "model.pickle_weights",
                    "a pickle (or zip) archive named .safetensors: xconf never loads pickles",
                    path,
                )
            n = header_length(head, size, str(path))
            raw = _read_exactly(fd, 8, n, path)
        header = parse_header(raw, size - 8 - n, str(path))
    except ArtifactError as exc:
        code = "model.truncated_weights" if exc.code == "safetensors.truncated" else None
        if exc.code in ("artifacts.not_a_file", "artifacts.symlink", "artifacts.io"):
            code = "model.unreadable"
        raise _error(code or "model.bad_safetensors", exc.message, exc.path or path) from None
    except OSError as exc:
        raise _error("model.unreadable", f"cannot read weights: {exc}", path) from exc
    data_size = size - 8 - n
    cursor = 0
    for entry in sorted(header.entries.values(), key=lambda e: (e.begin, e.end)):
        if entry.begin != cursor:
            raise _error(
                "model.bad_safetensors",
                f"tensor data at byte {entry.begin} overlaps or leaves a gap after byte {cursor}",
                f"{path}:{entry.name}",
            )
        cursor = entry.end
    if cursor != data_size:
        raise _error(
            "model.bad_safetensors",
            f"the header covers {cursor} data bytes, the file holds {data_size}",
            path,
        )
    return {e.name: (e.dtype, e.shape) for e in header.entries.values()}


def _read_exactly(fd: int, offset: int, count: int, path: Path) -> bytes:
    chunks, done = [], 0
    while done < count:
        chunk = os.pread(fd, min(count - done, 16 << 20), offset + done)
        if not chunk:
            raise _error("model.truncated_weights", "the file ends inside its header", path)
        chunks.append(chunk)
        done += len(chunk)
    return b"".join(chunks)


def _expected_shapes(root: Path, trust_remote_code: bool) -> tuple[dict[str, tuple[int, ...]], str]:
    """The state-dict names and shapes transformers builds from the config (meta device)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    cfg = AutoConfig.from_pretrained(
        str(root), trust_remote_code=trust_remote_code, local_files_only=True
    )
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg, trust_remote_code=trust_remote_code)
    finally:
        hf_logging.set_verbosity(verbosity)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    tied = {str(k) for k in (getattr(model, "_tied_weights_keys", None) or ())}
    if getattr(cfg.get_text_config(), "tie_word_embeddings", False):
        for name in tied or {"lm_head.weight"}:
            shapes.pop(name, None)
    return shapes, str(getattr(model, "base_model_prefix", "") or "")


def check_tensors(
    root: Path,
    headers: Mapping[Path, Mapping[str, tuple[str, tuple[int, ...]]]],
    trust_remote_code: bool,
) -> None:
    """Every tensor the model needs is there with the config's shape."""
    found: dict[str, tuple[tuple[int, ...], Path]] = {}
    for path, tensors in headers.items():
        for name, (_dtype, shape) in tensors.items():
            found[name] = (shape, path)
    try:
        expected, prefix = _expected_shapes(root, trust_remote_code)
    except Exception as exc:  # a config transformers reads but cannot build a model from
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise _error(
            "model.bad_config",
            f"transformers cannot build the model from config.json: {message[:300]}",
            root / "config.json",
        ) from exc
    # Checkpoints saved without the base model's prefix ("transformer.h.0..." as "h.0...")
    # load in transformers all the same.
    if prefix and not any(k.startswith(prefix + ".") for k in found):
        found = {f"{prefix}.{k}": v for k, v in found.items()}
    missing = sorted(set(expected) - set(found))
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise _error(
            "model.missing_tensor",
            f"the weights lack {missing[:3]}{more}, which config.json's model needs",
            root,
        )
    for name, shape in sorted(expected.items()):
        have, path = found[name]
        if tuple(have) != shape:
            raise _error(
                "model.tensor_shape",
                f"shape {list(have)}, config.json's model needs {list(shape)}",
                f"{path}:{name}",
            )


def check_tokenizer(tok_root: Path, vocab_size: int, trust_remote_code: bool) -> None:
    """The tokenizer loads, runs no checkpoint code unless allowed, and fits the vocab."""
    tok_cfg = tok_root / "tokenizer_config.json"
    if tok_cfg.exists():
        doc = read_checkpoint_json(tok_cfg, "model.bad_tokenizer")
        if isinstance(doc, dict) and doc.get("auto_map") and not trust_remote_code:
            raise _error(
                "model.remote_code",
                "tokenizer_config.json asks for code from the checkpoint (auto_map); "
                "set runtime.trust_remote_code=true only if you trust it",
                f"{tok_cfg}:auto_map",
            )
    tok_json = tok_root / "tokenizer.json"
    text = read_checkpoint_bytes(tok_json, "model.bad_tokenizer")  # bounded, never a FIFO
    if text is not None:
        where = tok_json
        try:
            from tokenizers import Tokenizer

            ids = list(
                Tokenizer.from_str(text.decode("utf-8")).get_vocab(with_added_tokens=True).values()
            )
        except Exception as exc:  # tokenizers raises its own Exception type
            raise _error(
                "model.bad_tokenizer", f"tokenizers cannot load it: {str(exc)[:300]}", tok_json
            ) from exc
    else:
        where = tok_root
        try:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(
                str(tok_root), trust_remote_code=trust_remote_code, local_files_only=True
            )
            ids = list(tok.get_vocab().values())
        except Exception as exc:
            raise _error(
                "model.bad_tokenizer", f"transformers cannot load it: {str(exc)[:300]}", tok_root
            ) from exc
    if not ids:
        raise _error("model.bad_tokenizer", "the tokenizer has no tokens", where)
    top = max(ids)
    if top >= vocab_size:
        raise _error(
            "model.tokenizer_vocab",
            f"token id {top} does not fit config.json's vocab_size {vocab_size}",
            where,
        )


def check_architecture(facts: ModelFacts) -> None:
    """transformers builds the class its ``model_type`` maps to, vLLM the one ``architectures``
    names: when they differ (``model_type qwen3`` with ``LlamaForCausalLM``) the two sides
    would score two different models, so the checkpoint is refused."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    mapped = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(facts.model_type)
    names = (mapped,) if isinstance(mapped, str) else tuple(mapped or ())
    if names and facts.architecture not in names:
        raise _error(
            "model.architecture_mismatch",
            f"model_type '{facts.model_type}' is {', '.join(names)} in transformers, but "
            f"architectures names {facts.architecture} (what vLLM builds): the config means "
            "two different models",
            f"{facts.config_path}:architectures",
        )


def check_shards(root: Path, headers: Mapping[Path, Mapping[str, Any]]) -> None:
    """Each tensor is held by one weight file, the one the index names: a tensor in two
    shards (two ``lm_head.weight`` with different values) is whichever copy a loader reads
    last, and an index that names another shard than the one holding it is two layouts."""
    owner: dict[str, Path] = {}
    for path, tensors in headers.items():
        for name in tensors:
            if name in owner:
                raise _error(
                    "model.duplicate_tensor",
                    f"held by both {owner[name].name} and {path.name}: the engines would each "
                    "load one of the two",
                    f"{path}:{name}",
                )
            owner[name] = path
    index_path = root / "model.safetensors.index.json"
    index = read_checkpoint_json(index_path, "model.bad_index")
    if index is None:
        return
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    for name, path in sorted(owner.items()):
        if not isinstance(weight_map, dict) or weight_map.get(name) != path.name:
            listed = weight_map.get(name) if isinstance(weight_map, dict) else None
            raise _error(
                "model.index_mismatch",
                f"{path.name} holds it, the index names {listed!r}",
                f"{index_path}:{name}",
            )
    missing = sorted(set(weight_map) - set(owner)) if isinstance(weight_map, dict) else []
    if missing:
        raise _error(
            "model.index_mismatch",
            f"the index names {missing[:3]}, which no shard holds",
            index_path,
        )


def check_checkpoint(
    root: Path,
    tok_root: Path,
    facts: ModelFacts,
    weight_files: Sequence[Path],
    trust_remote_code: bool,
) -> dict[Path, Any]:
    """All of the above; returns each weight file's header (name -> dtype, shape)."""
    check_architecture(facts)
    headers = {path: read_header(path) for path in weight_files}
    check_shards(root, headers)
    check_tensors(root, headers, trust_remote_code)
    check_tokenizer(tok_root, facts.vocab_size, trust_remote_code)
    return headers
