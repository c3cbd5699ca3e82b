"""Build the training-side transformers model: attention backend, compute dtype, sharding."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from xconf.adapters.errors import RuntimeUnavailableError, UnsupportedKnobError
from xconf.adapters.hf.settings import HfSettings
from xconf.knobs import (
    ALIGN_KINDS,
    ALIGN_OFF,
    ALIGN_PREFIX,
    ALIGN_VLLM,
    DTYPES,
    LOGITS_DTYPE_CHOICES,
    LOGITS_FLOAT32,
    TRAINING_ATTENTION_BACKEND,
    TRAINING_COMPUTE_DTYPE,
    TRAINING_LOGITS_DTYPE,
    TRAINING_SCORING_MODE,
    TRAINING_SHARDING,
    TRAINING_TEMPERATURE,
    KnobValueError,
    canonical,
)
from xconf.runtime.readback import (
    TRAINING_DEVICE,
    TRAINING_FSDP_WRAPPED_MODULES,
    TRAINING_LAUNCHER_WORLD_SIZE,
    TRAINING_MODEL_CLASS,
    TRAINING_VOCAB_LAYOUT,
    TRAINING_WORLD_SIZE,
)
from xconf.runtime.settings import built_from

ATTENTION_BACKENDS = ("eager", "sdpa", "flash_attention_2")
# The knob fields' defaults: the side's settings own them (one place).
_SETTINGS = HfSettings()
# The training side's settings no scorer field holds: the requests' batch size, the operator
# binding's backend.
SETTINGS_NOT_BUILT = frozenset({"batch_size", "logp_backend"})


def normalize_sharding(value: str) -> str:
    """The canonical sharding (``unsharded`` or ``fsdp``) of any accepted spelling."""
    try:
        return str(canonical(TRAINING_SHARDING.path, value))
    except KnobValueError as exc:
        raise UnsupportedKnobError("unsupported_value", str(exc), TRAINING_SHARDING.path) from exc


@dataclass(frozen=True)
class TrainingScorerConfig:
    """The scorer's construction: the side's settings (``settings.HfSettings``, copied field
    by field: ``from_settings``) and where the model comes from. Reuse is not its to decide:
    the engine cache keys engines by the case binding's fingerprints."""

    model_path: str
    attention_backend: str = _SETTINGS.attention_backend
    compute_dtype: str = _SETTINGS.compute_dtype
    sharding: str = _SETTINGS.sharding
    device: str = "cpu"
    # FSDP2 MixedPrecisionPolicy (``none``: no policy); only an FSDP2 model takes one.
    param_dtype: str = _SETTINGS.param_dtype
    reduce_dtype: str = _SETTINGS.reduce_dtype
    # Score each request as one packed row (per-sample positions, no padding, no mask).
    remove_padding: bool = _SETTINGS.remove_padding
    trust_remote_code: bool = False
    # The scoring shape: ``full`` (one teacher-forced forward per request) or ``decode`` (the
    # rollout engine's steps over a KV cache); the replacement arms (docs/arms.md), one
    # setting per kind and the full arm (``align``: the kinds they install).
    scoring_mode: str = _SETTINGS.scoring_mode
    align_rms_norm: str = _SETTINGS.align_rms_norm
    align_linear: str = _SETTINGS.align_linear
    align_rotary: str = _SETTINGS.align_rotary
    align_attention: str = _SETTINGS.align_attention
    align_activation: str = _SETTINGS.align_activation
    align_logits: str = _SETTINGS.align_logits
    align_all: str = _SETTINGS.align_all
    # The lm_head's dtype: ``model`` (the compute dtype) or ``float32`` (``head.py``).
    logits_dtype: str = _SETTINGS.logits_dtype
    # The divisor of the logits before the log-softmax (``head.py``; 1.0: none).
    temperature: float = _SETTINGS.temperature

    @classmethod
    def from_settings(cls, settings: HfSettings, **construction: Any) -> TrainingScorerConfig:
        """The scorer built for the side's settings: every setting that is a field here, by
        name (``SETTINGS_NOT_BUILT`` are none), and where the model comes from."""
        return built_from(cls, settings, **construction)

    @property
    def align(self) -> tuple[str, ...]:
        """The arm kinds the scorer installs, in ``ALIGN_KINDS`` order (every kind under the
        full arm)."""
        if self.align_all == ALIGN_VLLM:
            return ALIGN_KINDS
        return tuple(k for k in ALIGN_KINDS if getattr(self, f"align_{k}") == ALIGN_VLLM)

    def validate(self) -> None:
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise UnsupportedKnobError(
                "unsupported_value",
                f"attention backend {self.attention_backend!r} not in {ATTENTION_BACKENDS}",
                TRAINING_ATTENTION_BACKEND.path,
            )
        if self.attention_backend == "flash_attention_2" and self.device == "cpu":
            raise UnsupportedKnobError(
                "unsupported_on_device",
                "flash_attention_2 needs CUDA; this scorer runs on CPU",
                TRAINING_ATTENTION_BACKEND.path,
            )
        if self.compute_dtype not in DTYPES:
            raise UnsupportedKnobError(
                "unsupported_value",
                f"compute dtype {self.compute_dtype!r} not in {DTYPES}",
                TRAINING_COMPUTE_DTYPE.path,
            )
        sharding = normalize_sharding(self.sharding)
        self._validate_shaping(sharding)
        for name in ("param_dtype", "reduce_dtype"):
            value = getattr(self, name)
            if value != "none" and value not in DTYPES:
                raise UnsupportedKnobError(
                    "unsupported_value", f"{name} {value!r} not in {DTYPES}", f"training.{name}"
                )
            if value != "none" and sharding != "fsdp":
                raise UnsupportedKnobError(
                    "unsupported_value",
                    f"{name}={value} is an FSDP2 MixedPrecisionPolicy; the model is unsharded",
                    f"training.{name}",
                )

    def _validate_shaping(self, sharding: str) -> None:
        for kind in (*ALIGN_KINDS, "all"):
            value = getattr(self, f"align_{kind}")
            if value not in (ALIGN_OFF, ALIGN_VLLM):
                raise UnsupportedKnobError(
                    "unsupported_value",
                    f"arm value {value!r} (values: {ALIGN_OFF}, {ALIGN_VLLM})",
                    f"{ALIGN_PREFIX}.{kind}",
                )
        if self.scoring_mode not in TRAINING_SCORING_MODE.choices.values():  # type: ignore[union-attr]
            raise UnsupportedKnobError(
                "unsupported_value",
                f"scoring mode {self.scoring_mode!r}",
                TRAINING_SCORING_MODE.path,
            )
        if self.logits_dtype not in LOGITS_DTYPE_CHOICES.values():
            raise UnsupportedKnobError(
                "unsupported_value",
                f"logits dtype {self.logits_dtype!r}",
                TRAINING_LOGITS_DTYPE.path,
            )
        if self.logits_dtype == LOGITS_FLOAT32 and (sharding == "fsdp" or "logits" in self.align):
            raise UnsupportedKnobError(
                "unsupported_value",
                "a float32 lm_head is built on an unsharded model without the logits arm",
                TRAINING_LOGITS_DTYPE.path,
            )
        if not (isinstance(self.temperature, int | float) and 0.0 < self.temperature < 1e9):
            raise UnsupportedKnobError(
                "unsupported_value",
                f"temperature {self.temperature!r}: a finite number above 0",
                TRAINING_TEMPERATURE.path,
            )
        if self.temperature != 1.0 and sharding == "fsdp":
            raise UnsupportedKnobError(
                "unsupported_value",
                "the logits are divided by a temperature on an unsharded model",
                TRAINING_TEMPERATURE.path,
            )
        if sharding == "fsdp" and (self.align or self.scoring_mode != "full"):
            raise UnsupportedKnobError(
                "arm.unsupported",
                "the arms and the decode mode replace forwards of an unsharded model; FSDP2 "
                "wraps them",
                TRAINING_SHARDING.path,
            )


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
    from xconf.adapters.models.facts import load_failure
    from xconf.errors import XconfError

    dtype = getattr(torch, cfg.compute_dtype)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            cfg.model_path,
            dtype=dtype,
            attn_implementation=cfg.attention_backend,
            use_safetensors=True,  # never unpickle a checkpoint
            trust_remote_code=cfg.trust_remote_code,
        )
    except XconfError:
        raise  # a case deadline, already coded
    except Exception as exc:  # whatever transformers raises on a checkpoint it cannot load
        raise load_failure("transformers", exc, cfg.model_path) from exc
    model.to(cfg.device)  # type: ignore[arg-type]
    return model


def decoder_layers(model: Any) -> list[Any]:
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise UnsupportedKnobError(
            "unsupported_architecture",
            f"{type(model).__name__} has no model.layers to shard",
            TRAINING_SHARDING.path,
        )
    return list(layers)


def mixed_precision(param_dtype: str, reduce_dtype: str) -> Any:
    """The FSDP2 policy for two knob values (``none``: FSDP2's default for that field)."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    def as_dtype(name: str) -> Any:
        return None if name == "none" else getattr(torch, name)

    return MixedPrecisionPolicy(
        param_dtype=as_dtype(param_dtype), reduce_dtype=as_dtype(reduce_dtype)
    )


def apply_fsdp2(
    model: Any, device: str = "cpu", group: Any = None, mp_policy: Any = None
) -> dict[str, Any]:
    """``fully_shard`` every decoder layer and the root over ``group`` (None: the world).

    ``group`` is the training side's sub-group of a larger launched world: the FSDP degree
    is set by the training knobs, never by how many ranks the rollout side needed.
    """
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise UnsupportedKnobError(
            "process_group_missing",
            "fsdp needs torch.distributed initialised by the launcher (torchrun, gloo)",
            TRAINING_SHARDING.path,
        )
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if group is None:
        world = dist.get_world_size()
        mesh = init_device_mesh(device, (world,))
    else:
        from torch.distributed.device_mesh import DeviceMesh

        world = dist.get_world_size(group)
        mesh = DeviceMesh.from_group(group, device)
    policy = {} if mp_policy is None else {"mp_policy": mp_policy}
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, **policy)
    # The root too reshards after forward, so the registered parameters are the local
    # shards again when scoring ends (and the read-only digest compares like with like).
    fully_shard(model, mesh=mesh, reshard_after_forward=True, **policy)
    return {"world_size": world, "backend": dist.get_backend(group)}


def reshard(model: Any) -> None:
    """Return every FSDP2 module to its sharded state (no-op for an unsharded model)."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover
        return
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


@dataclass(frozen=True)
class ModelState:
    """What the model actually is now (its attention implementation, its parameters' dtypes,
    its FSDP wrapping and policy): the training handlers read each knob from it."""

    attention: str  # config._attn_implementation
    param_dtypes: tuple[str, ...]  # the parameters' dtypes, sorted (one: a single dtype)
    sharding: str  # fsdp, unsharded, or partial (some modules wrapped, the root not)
    policy: tuple[str, str]  # the FSDP2 root's MixedPrecisionPolicy (param, reduce) dtypes
    readings: dict[str, Any]  # what the model reports beside its knobs


def model_state(model: Any) -> ModelState:
    """The model's live state: attention implementation, dtypes, FSDP wrapping."""
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
    sharding = "fsdp" if root_wrapped and dtensor else ("unsharded" if not wrapped else "partial")
    readings = {
        TRAINING_FSDP_WRAPPED_MODULES.name: wrapped,
        # The ranks the parameters are really sharded over (the FSDP mesh), not the world.
        TRAINING_WORLD_SIZE.name: _mesh_size(params),
        TRAINING_LAUNCHER_WORLD_SIZE.name: dist.get_world_size() if dist.is_initialized() else 1,
        TRAINING_DEVICE.name: str(params[0].device) if params else "none",
        TRAINING_MODEL_CLASS.name: type(model).__name__,
        TRAINING_VOCAB_LAYOUT.name: _vocab_layout(model),
    }
    return ModelState(
        str(model.config._attn_implementation),
        tuple(dtypes),
        sharding,
        _policy(model if root_wrapped else None),
        readings,
    )


def _vocab_layout(model: Any) -> Any:
    """The output vocabulary as the lm_head is built: real size from the config, padded size
    from the head's rows. Not vocab-parallel: FSDP gathers the head's weight before each
    forward, so every rank's logits span the whole padded vocabulary (one shard)."""
    from xconf.ops.logprob.contract import ShardingSpec
    from xconf.ops.logprob.errors import LogprobContractError
    from xconf.runtime.protocol import ReadbackFailure

    try:
        padded = int(model.get_output_embeddings().weight.shape[0])
        return ShardingSpec(int(model.config.vocab_size), padded, ((0, padded),))
    except (AttributeError, LogprobContractError) as exc:
        return ReadbackFailure(f"lm_head vocab layout: {type(exc).__name__}: {exc}")


def _mesh_size(params: list[Any]) -> int | None:
    """1 for plain tensors; the mesh size of DTensor parameters; None when they disagree."""
    sizes = {int(p.device_mesh.size()) for p in params if hasattr(p, "device_mesh")}
    if not sizes:
        return 1
    return sizes.pop() if len(sizes) == 1 else None


def _policy(root: Any) -> tuple[str, str]:
    """The MixedPrecisionPolicy the FSDP2 root really runs with (``none`` per unset field)."""
    if root is None:  # an unsharded model has no policy
        return ("none", "none")
    policy = root._get_fsdp_state()._mp_policy

    def name(dtype: Any) -> str:
        return "none" if dtype is None else str(dtype).removeprefix("torch.")

    return (name(policy.param_dtype), name(policy.reduce_dtype))
