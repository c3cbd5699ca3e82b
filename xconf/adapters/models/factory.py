"""Tiny Qwen3/Llama checkpoints with deterministic random weights, built locally.

``ensure_model(spec)`` builds (once) a checkpoint with ``save_pretrained`` (safetensors, HF
config, generation config) and an offline BPE tokenizer into ``$XCONF_MODEL_CACHE`` (default
``~/.cache/xconf/models``) under a directory named by the spec's content digest, and returns
a :class:`ModelRecord` whose ``checkpoint_sha256`` is the SHA-256 of the weight file.
Nothing touches a model hub.

Weights are drawn name by name from one seeded generator (not from transformers' own
initializers, which change between releases), and the output head is drawn with a large
standard deviation so that logits are far from uniform and drift is visible.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Literal

from xconf.adapters.errors import (
    IdentityViolationError,
    ModelFactoryError,
    RuntimeUnavailableError,
)
from xconf.adapters.models.tokenizer import TOKENIZER_RECIPE_VERSION, train_tokenizer
from xconf.artifacts.layout import UNBOUNDED, sha256_file
from xconf.canonical import canonical_digest
from xconf.errors import XconfError

# v2: written with save_pretrained (v1 wrote safetensors and config.json by hand).
FACTORY_VERSION = "xconf-tiny-model.v2"
MANIFEST = "xconf_model.json"
WEIGHTS = "model.safetensors"
CACHE_ENV = "XCONF_MODEL_CACHE"

Arch = Literal["qwen3", "llama"]
_ARCH_CLASS = {"qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM"}


@dataclass(frozen=True)
class ModelSpec:
    """Everything that determines a tiny checkpoint; its digest keys the cache."""

    arch: Arch = "qwen3"
    vocab_size: int = 512
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32  # vLLM CPU attention supports 32, 64, 80, ...
    max_position_embeddings: int = 256
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    init_std: float = 0.05
    lm_head_std: float = 0.5
    seed: int = 1234

    def digest(self) -> str:
        payload = {
            "factory": FACTORY_VERSION,
            "tokenizer": TOKENIZER_RECIPE_VERSION,
            "spec": asdict(self),
        }
        return canonical_digest(payload)


def model_spec(options: Mapping[str, Any] | None) -> ModelSpec:
    """The ``ModelSpec`` a recipe's ``model`` options name; an unknown option is an identity
    violation naming its key (the recipe would otherwise describe a model xconf never built)."""
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


@dataclass(frozen=True)
class ModelRecord:
    """A built checkpoint: where it is and what it is (digests, tokenizer id)."""

    path: str
    arch: str
    architecture: str
    spec_sha256: str
    checkpoint_sha256: str
    tokenizer_id: str
    tokenizer_sha256: str
    eos_token_id: int
    vocab_size: int
    model_version: str
    tokenizer_path: str | None = None  # None: the tokenizer files are in ``path``
    local: bool = False  # a user's checkpoint directory (digest re-checked before each build)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def default_cache_dir() -> Path:
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    return Path("~/.cache/xconf/models").expanduser()


def _hf_config(spec: ModelSpec, eos_token_id: int) -> Any:
    try:
        from transformers import LlamaConfig, Qwen3Config
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise RuntimeUnavailableError(
            "runtime_unavailable", f"transformers is not installed: {exc}", "model"
        ) from exc
    common: dict[str, Any] = dict(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        rope_theta=spec.rope_theta,
        rms_norm_eps=spec.rms_norm_eps,
        tie_word_embeddings=False,
        bos_token_id=eos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=eos_token_id,
        initializer_range=spec.init_std,
        architectures=[_ARCH_CLASS[spec.arch]],
    )
    cfg: Any
    if spec.arch == "qwen3":
        cfg = Qwen3Config(**common)
    elif spec.arch == "llama":
        cfg = LlamaConfig(**common)
    else:
        raise ModelFactoryError("unsupported_arch", f"unknown arch {spec.arch!r}", "spec.arch")
    cfg.dtype = "float32"
    return cfg


def _deterministic_state_dict(spec: ModelSpec, cfg: Any) -> dict[str, Any]:
    """Shapes from the transformers model; values from one seeded generator, by name."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        shapes = {
            k: tuple(v.shape) for k, v in AutoModelForCausalLM.from_config(cfg).state_dict().items()
        }
    gen = torch.Generator(device="cpu").manual_seed(spec.seed)
    out: dict[str, Any] = {}
    for name in sorted(shapes):
        shape = shapes[name]
        if name.endswith("norm.weight"):
            tensor = torch.ones(shape, dtype=torch.float32)
        elif name.endswith(".bias"):
            tensor = torch.zeros(shape, dtype=torch.float32)
        else:
            std = spec.lm_head_std if name == "lm_head.weight" else spec.init_std
            tensor = torch.randn(shape, generator=gen, dtype=torch.float32) * std
        out[name] = tensor.contiguous()
    return out


def _build(spec: ModelSpec, out_dir: Path) -> ModelRecord:
    """Write a plain Hugging Face directory: ``save_pretrained`` (safetensors) plus the
    tokenizer, exactly what a user's own checkpoint looks like."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig
    from transformers.utils import logging as hf_logging

    tok = train_tokenizer(spec.vocab_size, out_dir, spec.max_position_embeddings)
    cfg = _hf_config(spec, tok.eos_token_id)
    weights = _deterministic_state_dict(spec, cfg)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    # assign=True swaps the meta tensors for ours: no random init, no copy.
    model.load_state_dict(weights, strict=True, assign=True)
    model.generation_config = GenerationConfig(
        eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id
    )
    progress_bar = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # its shard bar would land in xconf's own output
    try:
        model.save_pretrained(out_dir, safe_serialization=True)
    finally:
        if progress_bar:
            hf_logging.enable_progress_bar()
    if not (out_dir / WEIGHTS).is_file():  # sharded or renamed by a future transformers
        raise ModelFactoryError(
            "model.unexpected_layout", f"save_pretrained wrote no {WEIGHTS}", str(out_dir)
        )
    ckpt_sha = sha256_file(out_dir / WEIGHTS, limit=UNBOUNDED, follow=True)
    record = ModelRecord(
        path=str(out_dir),
        arch=spec.arch,
        architecture=_ARCH_CLASS[spec.arch],
        spec_sha256=spec.digest(),
        checkpoint_sha256=ckpt_sha,
        tokenizer_id=tok.tokenizer_id,
        tokenizer_sha256=tok.tokenizer_sha256,
        eos_token_id=tok.eos_token_id,
        vocab_size=spec.vocab_size,
        model_version=f"{FACTORY_VERSION}:{spec.arch}:{ckpt_sha[:16]}",
    )
    manifest = {"spec": asdict(spec), "record": record.to_dict(), "files": _file_digests(out_dir)}
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return record


def _file_digests(model_dir: Path) -> dict[str, str] | None:
    """SHA-256 of every top-level file of a built checkpoint but its manifest (what the
    engines read; subdirectories such as ``frozen/`` and hidden entries are not theirs).
    None: an entry that is no regular file (a link, a FIFO) is no built checkpoint's."""
    out = {}
    for entry in sorted(model_dir.iterdir()):
        if entry.name == MANIFEST or entry.name.startswith("."):
            continue
        if entry.is_symlink() or not (entry.is_file() or entry.is_dir()):
            return None
        if entry.is_file():
            out[entry.name] = sha256_file(entry, limit=UNBOUNDED)
    return out


def _load_verified(model_dir: Path, spec: ModelSpec) -> ModelRecord | None:
    """The cached record when the manifest (bounded JSON) is the spec's and every file of the
    directory is the one the manifest records (config.json included: an edited rope_theta is
    another model), else None and the checkpoint is built again."""
    from xconf.adapters.models.facts import read_checkpoint_json

    try:
        manifest = read_checkpoint_json(model_dir / MANIFEST)
        rec = dict(manifest["record"])
        files = dict(manifest["files"])
        rec["path"] = str(model_dir)
        record = ModelRecord(**rec)
        if record.spec_sha256 != spec.digest() or _file_digests(model_dir) != files:
            return None
    except (OSError, KeyError, TypeError, ValueError, XconfError):
        return None  # absent, unreadable, of an older layout: rebuilt
    if files.get(WEIGHTS) != record.checkpoint_sha256:
        return None
    if files.get("tokenizer.json") != record.tokenizer_sha256:
        return None
    return record


def write_checkpoint(spec: ModelSpec, directory: Path | str) -> ModelRecord:
    """Build the tiny checkpoint into a new user directory (``xconf make-checkpoint``).

    The directory must not exist or be empty; it is built beside it and renamed into
    place, so a failure leaves nothing half-written.
    """
    target = Path(directory).expanduser().absolute()
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ModelFactoryError(
            "model.target_not_empty", "refusing to write into a non-empty path", str(target)
        )
    if not target.parent.is_dir():
        raise ModelFactoryError(
            "model.no_parent", "the parent directory does not exist", str(target.parent)
        )
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.build-", dir=target.parent))
    try:
        record = _build(spec, tmp)
        if target.exists():
            target.rmdir()
        os.rename(tmp, target)
    except OSError as exc:
        raise ModelFactoryError("model_build_failed", str(exc), str(target)) from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return replace(record, path=str(target))


RANK_ZERO_WAIT_S = 600.0  # how long another rank waits for rank 0's checkpoint


def _not_rank_zero() -> bool:
    """In a rank other than 0 of a torch.distributed world, where transformers'
    ``save_pretrained`` writes nothing (rank 0 alone saves): that rank cannot build."""
    import sys

    dist = sys.modules.get("torch.distributed")
    return bool(dist and dist.is_available() and dist.is_initialized() and dist.get_rank() != 0)


def _published_by_rank_zero(target: Path, spec: ModelSpec) -> ModelRecord:
    """Rank 0 of the same world builds the same checkpoint: wait for it (bounded)."""
    import time

    deadline = time.monotonic() + RANK_ZERO_WAIT_S
    while time.monotonic() < deadline:
        record = _load_verified(target, spec)
        if record is not None:
            return record
        time.sleep(0.5)
    raise ModelFactoryError(
        "model.not_published",
        f"rank 0 did not publish the checkpoint within {RANK_ZERO_WAIT_S:.0f}s",
        str(target),
    )


def ensure_model(spec: ModelSpec | None = None, cache_dir: Path | str | None = None) -> ModelRecord:
    """Build the checkpoint for ``spec`` once; later calls verify and reuse it.

    Building happens in a private temporary directory that is renamed into place, so
    concurrent callers never see a half-written checkpoint. A cached directory whose
    digests no longer match is rebuilt.
    """
    spec = spec or ModelSpec()
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    target = root / f"{spec.arch}-{spec.digest()[:16]}"
    cached = _load_verified(target, spec)
    if cached is not None:
        return cached
    if _not_rank_zero():
        return _published_by_rank_zero(target, spec)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=root))
    try:
        _build(spec, tmp)
        if target.exists() and _load_verified(target, spec) is None:
            shutil.rmtree(target, ignore_errors=True)  # stale or corrupt copy
        try:
            os.rename(tmp, target)
        except OSError:
            # Another process (another rank) published the same checkpoint first.
            if _load_verified(target, spec) is None:
                raise
    except OSError as exc:
        raise ModelFactoryError("model_build_failed", str(exc), str(target)) from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    record = _load_verified(target, spec)
    if record is None:
        raise ModelFactoryError(
            "model_verify_failed", "built checkpoint failed verification", str(target)
        )
    return record
