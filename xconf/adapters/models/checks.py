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

import json
import math
import os
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from xconf.adapters.errors import ModelFactoryError
from xconf.adapters.models.facts import ModelFacts

# Bytes per element of every dtype the safetensors format names.
_ITEMSIZE = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}
# safetensors itself refuses headers above 100 MB.
MAX_HEADER_BYTES = 100 << 20
_PICKLE_MAGIC = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05", b"PK\x03\x04")


def _error(code: str, message: str, where: Path | str) -> ModelFactoryError:
    return ModelFactoryError(code, message, str(where))


def read_header(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Tensor name -> (dtype, shape) from one safetensors file, every offset checked."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            head = fh.read(8)
            if len(head) < 8:
                raise _error(
                    "model.bad_safetensors", f"{size}-byte file: no safetensors header", path
                )
            if head.startswith(_PICKLE_MAGIC):
                raise _error(
                    "model.pickle_weights",
                    "a pickle (or zip) archive named .safetensors: xconf never loads pickles",
                    path,
                )
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER_BYTES or n > size - 8:
                raise _error(
                    "model.bad_safetensors",
                    f"header length {n} does not fit the {size}-byte file",
                    path,
                )
            raw = fh.read(n)
    except OSError as exc:
        raise _error("model.unreadable", f"cannot read weights: {exc}", path) from exc
    try:
        header = json.loads(raw)
        if not isinstance(header, dict):
            raise ValueError("not a JSON object")
    except (ValueError, UnicodeDecodeError) as exc:
        raise _error("model.bad_safetensors", f"header is not JSON: {exc}", path) from exc
    data_size = size - 8 - n
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    spans: list[tuple[int, int, str]] = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        where = f"{path}:{name}"
        try:
            dtype = entry["dtype"]
            shape = tuple(entry["shape"])
            begin, end = entry["data_offsets"]
        except (TypeError, KeyError, ValueError) as exc:
            raise _error("model.bad_safetensors", f"malformed tensor entry: {exc}", where) from exc
        if dtype not in _ITEMSIZE:
            raise _error("model.bad_safetensors", f"unknown dtype {dtype!r}", where)
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise _error("model.bad_safetensors", f"bad shape {list(shape)}", where)
        if not all(isinstance(o, int) and not isinstance(o, bool) for o in (begin, end)):
            raise _error("model.bad_safetensors", "bad data offsets", where)
        want = math.prod(shape) * _ITEMSIZE[dtype]
        if not 0 <= begin <= end or end - begin != want:
            raise _error(
                "model.bad_safetensors",
                f"{dtype}{list(shape)} needs {want} bytes, offsets give {end - begin}",
                where,
            )
        if end > data_size:
            raise _error(
                "model.truncated_weights",
                f"tensor data ends at byte {end}, the file holds {data_size} (truncated)",
                where,
            )
        out[name] = (dtype, shape)
        spans.append((begin, end, name))
    cursor = 0
    for begin, end, name in sorted(spans):
        if begin != cursor:
            raise _error(
                "model.bad_safetensors",
                f"tensor data at byte {begin} overlaps or leaves a gap after byte {cursor}",
                f"{path}:{name}",
            )
        cursor = end
    if cursor != data_size:
        raise _error(
            "model.bad_safetensors",
            f"the header covers {cursor} data bytes, the file holds {data_size}",
            path,
        )
    return out


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
    if tok_cfg.is_file():
        try:
            doc = json.loads(tok_cfg.read_text())
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            raise _error("model.bad_tokenizer", f"not valid JSON: {exc}", tok_cfg) from exc
        if isinstance(doc, dict) and doc.get("auto_map") and not trust_remote_code:
            raise _error(
                "model.remote_code",
                "tokenizer_config.json asks for code from the checkpoint (auto_map); "
                "set runtime.trust_remote_code=true only if you trust it",
                f"{tok_cfg}:auto_map",
            )
    tok_json = tok_root / "tokenizer.json"
    if tok_json.is_file():
        where = tok_json
        try:
            from tokenizers import Tokenizer

            ids = list(
                Tokenizer.from_file(str(tok_json)).get_vocab(with_added_tokens=True).values()
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


def check_checkpoint(
    root: Path,
    tok_root: Path,
    facts: ModelFacts,
    weight_files: Sequence[Path],
    trust_remote_code: bool,
) -> dict[Path, Any]:
    """All of the above; returns each weight file's header (name -> dtype, shape)."""
    headers = {path: read_header(path) for path in weight_files}
    check_tensors(root, headers, trust_remote_code)
    check_tokenizer(tok_root, facts.vocab_size, trust_remote_code)
    return headers
