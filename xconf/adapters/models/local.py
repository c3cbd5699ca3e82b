"""A user's own Hugging Face checkpoint directory: checked, digested, never unpickled.

``open_checkpoint(path)`` validates a checkpoint directory (``config.json``,
``*.safetensors`` with or without an index, tokenizer files in the model directory or in
``tokenizer_path``) and returns the same :class:`ModelRecord` the tiny-model factory does,
so both real runtimes treat a built and a user checkpoint alike. Before anything is
written it reads the config through transformers (:mod:`.facts`: a causal LM that both
transformers and vLLM have a class for) and checks every safetensors header, the tensor
names and shapes, and the tokenizer against the config (:mod:`.checks`). Weights only in
pickle formats (``pytorch_model.bin``, ``.pt``) are refused, never loaded.

The checkpoint digest is SHA-256 over the directory's files, each as (name, where a link
points, content digest): a symlink (a Hugging Face hub snapshot's links into ``blobs/``, or
any other) is followed, its target's bytes digested and its target named, so the digest
covers every byte the engines read. Each file's digest is cached in
``<model cache>/digests/`` keyed by (size, mtime_ns, ctime_ns, inode, device) of what the
link resolves to: a same-size rewrite that restores the mtime (and even the inode) still
moves ctime, which no user call can set back, so the file is hashed again. That is how a
checkpoint replaced under a run is detected (:func:`verify_unchanged`).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

from xconf.adapters.errors import IdentityViolationError, ModelFactoryError
from xconf.adapters.models.checks import check_checkpoint
from xconf.adapters.models.factory import (
    MANIFEST,
    ModelRecord,
    default_cache_dir,
)
from xconf.adapters.models.facts import (
    CHECKPOINT_TEXT_BYTES,
    model_facts,
    read_checkpoint_json,
    require_supported,
)
from xconf.artifacts import layout
from xconf.artifacts.layout import read_cache_entry
from xconf.artifacts.safe_io import write_cache_entry
from xconf.errors import ArtifactError

# The one file digest (artifacts/layout.py), unbounded and following a snapshot's links:
# checkpoint files are not run artifacts.
sha256_file = partial(layout.sha256_file, limit=layout.UNBOUNDED, follow=True)

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
INDEX = "model.safetensors.index.json"
# Besides the weights, the files a loader reads (config, tokenizer, templates, remote code).
TEXT_SUFFIXES = (".json", ".jinja", ".txt", ".model", ".tiktoken", ".py")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "added_tokens.json",
    "chat_template.jinja",
)
# v2: links followed and named; the cache key holds ctime and the device.
DIGEST_VERSION = "xconf-checkpoint-digest.v2"
CONVERT_HINT = (
    "convert it to safetensors once, in an environment you trust: "
    "`AutoModelForCausalLM.from_pretrained(DIR).save_pretrained(OUT, safe_serialization=True)`"
)


def _error(code: str, message: str, path: str | Path) -> ModelFactoryError:
    return ModelFactoryError(code, message, str(path))


def _regular_files(root: Path) -> list[Path]:
    """Top-level files (what from_pretrained reads), links to files included; hidden skipped.

    A FIFO, socket or device, or a link that leads nowhere or to one of those, is refused:
    the engines would read (or hang on) it, and its bytes could not be digested.
    Directories, linked or not, are skipped."""
    out = []
    for entry in sorted(root.iterdir()):
        if entry.name.startswith("."):
            continue
        mode = os.lstat(entry).st_mode
        if stat.S_ISREG(mode):
            out.append(entry)
        elif stat.S_ISLNK(mode):
            try:
                target_mode = os.stat(entry).st_mode
            except OSError as exc:
                raise _error(
                    "model.broken_link", f"a link that leads nowhere: {exc}", entry
                ) from exc
            if stat.S_ISDIR(target_mode):
                continue  # like a real subdirectory: from_pretrained reads top-level files
            if not stat.S_ISREG(target_mode):
                raise _error(
                    "model.bad_link", f"links to {os.path.realpath(entry)}, not a file", entry
                )
            out.append(entry)
        elif not stat.S_ISDIR(mode):
            raise _error("model.bad_file", "not a regular file (a FIFO, socket or device)", entry)
    return out


def link_target(path: Path) -> str | None:
    """Where a link finally points (None: a plain file); part of the digest."""
    return os.path.realpath(path) if path.is_symlink() else None


def loaded_files(root: Path) -> list[Path]:
    """The files of a checkpoint directory the engines (and xconf) read, which its digest
    covers: the weights they load (the index's shards, or every ``*.safetensors``), and its
    configuration and tokenizer files (:data:`TEXT_SUFFIXES`: ``config.json``, the index,
    ``tokenizer.json``, ``chat_template.jinja``, ``merges.txt``, ``tokenizer.model``, a
    remote-code ``*.py`` ...). Anything else beside them (an unreferenced shard, a pickle, a
    200 GB archive) is no part of the checkpoint and is never read. A text file over
    :data:`~xconf.adapters.models.facts.CHECKPOINT_TEXT_BYTES` is refused."""
    weights = {p.name for p in weight_files(root)}
    out = []
    for f in _regular_files(root):
        if f.name in weights:
            out.append(f)
        elif f.suffix in TEXT_SUFFIXES:
            if os.stat(f).st_size > CHECKPOINT_TEXT_BYTES:
                raise _error(
                    "model.too_large",
                    f"{os.stat(f).st_size} bytes: a checkpoint's configuration and tokenizer "
                    f"files are at most {CHECKPOINT_TEXT_BYTES}",
                    f,
                )
            out.append(f)
    return out


class DigestCache:
    """Per-file SHA-256 keyed by (size, mtime_ns, ctime_ns, inode, device, link target); one
    JSON file per directory under ``<model cache>/digests/``. An entry is believed only when
    the file and the directory are the user's own (owned by them, writable by neither group
    nor others: :func:`~xconf.artifacts.layout.read_cache_entry`); another directory is no
    cache at all (nothing read, nothing written), and a read-only one is written to never."""

    MAX_ENTRY_BYTES = 16 << 20

    def __init__(self, cache_dir: Path | str | None = None) -> None:
        root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
        self.root = root / "digests"

    def _file(self, directory: Path) -> Path:
        key = hashlib.sha256(str(directory.resolve()).encode()).hexdigest()[:32]
        return self.root / f"{key}.json"

    def _load(self, directory: Path) -> dict[str, Any]:
        data = read_cache_entry(self._file(directory), self.MAX_ENTRY_BYTES)
        try:
            doc = layout.parse_json(data, "digest cache") if data is not None else None
            if not isinstance(doc, dict) or doc.get("version") != DIGEST_VERSION:
                return {}
            if doc.get("path") != str(directory.resolve()):
                return {}  # an entry of another directory
            return dict(doc["files"])
        except (ArtifactError, KeyError, TypeError, ValueError):
            return {}

    def _store(self, directory: Path, files: Mapping[str, Any]) -> None:
        doc = {"version": DIGEST_VERSION, "path": str(directory.resolve()), "files": files}
        # False (not written) costs time on the next run, never correctness
        write_cache_entry(self._file(directory), json.dumps(doc, sort_keys=True).encode())

    def file_digests(self, directory: Path, files: list[Path]) -> dict[str, tuple[str, str]]:
        """``{name: (link target or "", sha256)}`` of ``files``, each of ``directory``."""
        cached = self._load(directory)
        fresh: dict[str, Any] = {}
        out: dict[str, tuple[str, str]] = {}
        for f in files:
            st = os.stat(f)  # of the link's target: the bytes the engines read
            target = link_target(f)
            key = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev, target]
            entry = cached.get(f.name)
            if isinstance(entry, dict) and entry.get("key") == key:
                sha = str(entry.get("sha256"))
            else:
                sha = sha256_file(f)
            fresh[f.name] = {"key": key, "sha256": sha}
            out[f.name] = (target or "", sha)
        merged = {**cached, **fresh}
        if merged != cached:
            self._store(directory, merged)
        return out

    def digest(self, directory: Path, names: tuple[str, ...] | None = None) -> str:
        """SHA-256 over (name, link target, file sha256) of the files the engines load
        (:func:`loaded_files`), or of the directory's files among ``names``."""
        if names is None:
            files = loaded_files(directory)
        else:
            files = [f for f in _regular_files(directory) if f.name in names]
        h = hashlib.sha256(DIGEST_VERSION.encode())
        for name, (target, sha) in self.file_digests(directory, files).items():
            h.update(f"{name}\0{target}\0{sha}\n".encode())
        return h.hexdigest()


def weight_files(root: Path) -> list[Path]:
    """The safetensors files the engines load (the index's shards, or every one)."""
    names = {p.name for p in _regular_files(root)}
    shards = {n for n in names if n.endswith(".safetensors")}
    index = root / INDEX
    document = read_checkpoint_json(index, "model.bad_index")
    if document is not None:
        weight_map = document.get("weight_map") if isinstance(document, dict) else None
        if not isinstance(weight_map, dict) or not all(
            isinstance(v, str) for v in weight_map.values()
        ):
            raise _error("model.bad_index", "the index has no weight_map of file names", index)
        wanted = set(weight_map.values())
        missing = sorted(wanted - shards)
        if missing:
            raise _error("model.missing_shard", f"index names missing shards {missing}", index)
        return [root / n for n in sorted(wanted)]
    if shards:
        return [root / n for n in sorted(shards)]
    pickles = sorted(n for n in names if n.endswith(PICKLE_SUFFIXES))
    if pickles:
        raise _error(
            "model.pickle_weights",
            f"only pickle weights {pickles}: xconf never loads pickles; {CONVERT_HINT}",
            root,
        )
    raise _error("model.no_weights", "no *.safetensors weights in the directory", root)


def _read_config(root: Path, trust_remote_code: bool) -> dict[str, Any]:
    cfg_path = root / "config.json"
    cfg = read_checkpoint_json(cfg_path)
    if cfg is None:
        raise _error("model.no_config", "no config.json in the checkpoint directory", cfg_path)
    if not isinstance(cfg, dict):
        raise _error("model.bad_config", "config.json is not a JSON object", cfg_path)
    if cfg.get("auto_map") and not trust_remote_code:
        raise _error(
            "model.remote_code",
            "config.json needs code from the checkpoint (auto_map); "
            "set runtime.trust_remote_code=true only if you trust it",
            cfg_path,
        )
    archs = cfg.get("architectures")
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        raise _error("model.no_architecture", "config.json names no architectures", cfg_path)
    return cfg


def _eos(cfg: Mapping[str, Any]) -> int:
    eos = cfg.get("eos_token_id")
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    return int(eos) if isinstance(eos, int) else -1


def _manifest_tokenizer_id(root: Path, tok_root: Path) -> str | None:
    """A checkpoint from ``xconf make-checkpoint`` keeps its factory tokenizer id."""
    try:
        record = read_checkpoint_json(root / MANIFEST)["record"]
        tokenizer_sha = sha256_file(tok_root / "tokenizer.json")
    except (OSError, KeyError, TypeError, ModelFactoryError, ArtifactError):
        return None
    if record.get("tokenizer_sha256") != tokenizer_sha:
        return None
    value = record.get("tokenizer_id")
    return str(value) if isinstance(value, str) else None


def open_checkpoint(
    path: str | Path,
    tokenizer_path: str | Path | None = None,
    *,
    trust_remote_code: bool = False,
    cache_dir: Path | str | None = None,
) -> ModelRecord:
    """Validate and digest a local checkpoint; nothing in it is loaded or executed."""
    root = Path(path).expanduser()
    if not root.is_dir():
        raise _error("model.missing_dir", "checkpoint directory does not exist", root)
    root = root.resolve()
    cfg = _read_config(root, trust_remote_code)
    shards = weight_files(root)
    tok_root = Path(tokenizer_path).expanduser().resolve() if tokenizer_path else root
    if not tok_root.is_dir():
        raise _error("model.missing_tokenizer_dir", "tokenizer directory does not exist", tok_root)
    if (
        not (tok_root / "tokenizer.json").is_file()
        and not (tok_root / "tokenizer_config.json").is_file()
    ):
        raise _error("model.no_tokenizer", "no tokenizer.json or tokenizer_config.json", tok_root)
    _regular_files(tok_root)  # a broken or odd link among the tokenizer files is refused too
    facts = model_facts(root, trust_remote_code)
    require_supported(facts)
    check_checkpoint(root, tok_root, facts, shards, trust_remote_code)
    cache = DigestCache(cache_dir)
    ckpt_sha = cache.digest(root)
    tok_sha = cache.digest(tok_root, TOKENIZER_FILES)
    arch = str(cfg["architectures"][0])
    tokenizer_id = _manifest_tokenizer_id(root, tok_root) or f"sha256:{tok_sha}"
    return ModelRecord(
        path=str(root),
        arch=str(cfg.get("model_type") or arch),
        architecture=arch,
        spec_sha256=ckpt_sha,
        checkpoint_sha256=ckpt_sha,
        tokenizer_id=tokenizer_id,
        tokenizer_sha256=tok_sha,
        eos_token_id=_eos(cfg),
        vocab_size=facts.vocab_size,
        model_version=f"local:{arch}:{ckpt_sha[:16]}",
        tokenizer_path=str(tok_root),
        local=True,
    )


def verify_unchanged(record: ModelRecord, cache_dir: Path | str | None = None) -> None:
    """Raise when a local checkpoint's files changed since the identity was frozen."""
    if not record.local:
        return
    root = Path(record.path)
    try:
        now = DigestCache(cache_dir).digest(root) if root.is_dir() else "missing"
    except OSError as exc:
        now = f"unreadable: {exc}"
    if now != record.checkpoint_sha256:
        raise IdentityViolationError(
            "identity.checkpoint_changed",
            f"checkpoint {root} changed under the run: frozen sha256:"
            f"{record.checkpoint_sha256[:16]}…, now {now[:16]}…",
            "runtime.model.path",
        )
