"""Build the training-side transformers model: attention backend, compute dtype, sharding."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from xconf.adapters.errors import RuntimeUnavailableError, UnsupportedKnobError
from xconf.canonical import canonical_digest

ATTENTION_BACKENDS = ("eager", "sdpa", "flash_attention_2")
COMPUTE_DTYPES = ("float32", "bfloat16", "float16")
SHARDINGS = ("unsharded", "fsdp2")
_SHARDING_ALIASES = {
    "none": "unsharded",
    "unsharded": "unsharded",
    "fsdp": "fsdp2",
    "fsdp2": "fsdp2",
}


def normalize_sharding(value: str) -> str:
    key = str(value).strip().lower()
    if key not in _SHARDING_ALIASES:
        raise UnsupportedKnobError(
            "unsupported_value",
            f"sharding {value!r} not in {sorted(_SHARDING_ALIASES)}",
            "training.sharding",
        )
    return _SHARDING_ALIASES[key]


@dataclass(frozen=True)
class TrainingScorerConfig:
    """Training-side construction knobs; the fingerprint decides scorer reuse."""

    model_path: str
    attention_backend: str = "sdpa"
    compute_dtype: str = "float32"
    sharding: str = "unsharded"
    device: str = "cpu"
    trust_remote_code: bool = False

    def validate(self) -> None:
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise UnsupportedKnobError(
                "unsupported_value",
                f"attention backend {self.attention_backend!r} not in {ATTENTION_BACKENDS}",
                "training.attention_backend",
            )
        if self.attention_backend == "flash_attention_2" and self.device == "cpu":
            raise UnsupportedKnobError(
                "unsupported_on_device",
                "flash_attention_2 needs CUDA; this scorer runs on CPU",
                "training.attention_backend",
            )
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise UnsupportedKnobError(
                "unsupported_value",
                f"compute dtype {self.compute_dtype!r} not in {COMPUTE_DTYPES}",
                "training.compute_dtype",
            )
        normalize_sharding(self.sharding)

    def fingerprint(self) -> str:
        return canonical_digest(asdict(self))


def load_model(cfg: TrainingScorerConfig) -> Any:
    """Load the checkpoint with the requested attention implementation and dtype."""
    cfg.validate()
    try:
        import torch
        from transformers import AutoModelForCausalLM
    except ImportError as exc:
        raise RuntimeUnavailableError(
            "runtime_unavailable", f"transformers cannot be imported: {exc}", "runtime.training"
        ) from exc
    dtype = getattr(torch, cfg.compute_dtype)
    model = AutoModelForCausalLM.from_pretrained(
        cfg.model_path,
        dtype=dtype,
        attn_implementation=cfg.attention_backend,
        use_safetensors=True,  # never unpickle a checkpoint
        trust_remote_code=cfg.trust_remote_code,
    )
    model.to(cfg.device)  # type: ignore[arg-type]
    return model


def decoder_layers(model: Any) -> list[Any]:
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise UnsupportedKnobError(
            "unsupported_architecture",
            f"{type(model).__name__} has no model.layers to shard",
            "training.sharding",
        )
    return list(layers)


def apply_fsdp2(model: Any, device: str = "cpu") -> dict[str, Any]:
    """``fully_shard`` every decoder layer and the root over the initialised world."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise UnsupportedKnobError(
            "process_group_missing",
            "fsdp2 needs torch.distributed initialised by the launcher (torchrun, gloo)",
            "training.sharding",
        )
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    world = dist.get_world_size()
    mesh = init_device_mesh(device, (world,))
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh)
    # The root too reshards after forward, so the registered parameters are the local
    # shards again when scoring ends (and the read-only digest compares like with like).
    fully_shard(model, mesh=mesh, reshard_after_forward=True)
    return {"world_size": world, "backend": dist.get_backend()}


def reshard(model: Any) -> None:
    """Return every FSDP2 module to its sharded state (no-op for an unsharded model)."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover
        return
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def readback(model: Any) -> dict[str, Any]:
    """What the model actually is now: attention implementation, dtypes, FSDP wrapping."""
    import torch.distributed as dist

    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover
        FSDPModule = ()  # type: ignore[assignment,misc]
    params = list(model.parameters())
    dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in params})
    wrapped = [n or "<root>" for n, m in model.named_modules() if isinstance(m, FSDPModule)]
    dtensor = any(hasattr(p, "to_local") and hasattr(p, "placements") for p in params)
    root_wrapped = isinstance(model, FSDPModule)
    sharding = "fsdp2" if root_wrapped and dtensor else ("unsharded" if not wrapped else "partial")
    return {
        "training.attention_backend": str(model.config._attn_implementation),
        "training.compute_dtype": dtypes[0] if len(dtypes) == 1 else dtypes,
        "training.sharding": sharding,
        "training.fsdp_wrapped_modules": wrapped,
        "training.world_size": dist.get_world_size() if dist.is_initialized() else 1,
        "training.device": str(params[0].device) if params else "none",
        "training.model_class": type(model).__name__,
    }
