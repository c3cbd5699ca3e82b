"""Build Megatron's ``GPTModel`` (local spec, no Transformer Engine) for one checkpoint.

:class:`MegatronConfig` is the side's typed construction record: every setting the model is
built with, its defaults in one place, its fingerprint the reuse key. :func:`build_model`
builds the model on this rank for its tensor-parallel group, loads xconf's weight mapping
(``weights.py``) and proves every parameter equals its checkpoint slice before it returns.
Megatron's own flags name what they switch: ``TransformerConfig.bias_activation_fusion`` is
the ``training.bias_activation_fusion`` knob, and so on.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from xconf.adapters.errors import ModelFactoryError, UnsupportedKnobError
from xconf.adapters.megatron.arch import MegatronArch
from xconf.adapters.megatron.settings import MegatronSettings
from xconf.adapters.megatron.weights import WeightCheck
from xconf.canonical import canonical_digest
from xconf.knobs import (
    DTYPES,
    TRAINING_ATTENTION_BACKEND,
    TRAINING_COMPUTE_DTYPE,
    TRAINING_SEQUENCE_PARALLEL,
    TRAINING_TENSOR_PARALLEL_SIZE,
)

# The core-attention modules the layer spec can be built with: ``eager`` is Megatron's own
# DotProductAttention, ``sdpa`` xconf's SdpaAttention (modules.py).
ATTENTIONS = ("eager", "sdpa")
_DEFAULTS = MegatronSettings()


@dataclass(frozen=True)
class MegatronConfig:
    """What the Megatron training side is built with; the fingerprint decides reuse. Its
    knob fields take their defaults from :class:`MegatronSettings` (the one place)."""

    model_path: str
    compute_dtype: str = _DEFAULTS.compute_dtype
    tensor_parallel_size: int = _DEFAULTS.tensor_parallel_size
    sequence_parallel: bool = _DEFAULTS.sequence_parallel
    attention_backend: str = _DEFAULTS.attention_backend
    remove_padding: bool = _DEFAULTS.remove_padding
    bias_activation_fusion: bool = _DEFAULTS.bias_activation_fusion
    bias_dropout_fusion: bool = _DEFAULTS.bias_dropout_fusion
    masked_softmax_fusion: bool = _DEFAULTS.masked_softmax_fusion
    apply_rope_fusion: bool = _DEFAULTS.apply_rope_fusion
    cross_entropy_loss_fusion: bool = _DEFAULTS.cross_entropy_loss_fusion
    device: str = "cpu"
    trust_remote_code: bool = False

    @classmethod
    def from_settings(cls, settings: MegatronSettings, **construction: Any) -> MegatronConfig:
        """The record for bound settings: every settings field that is one of this record's,
        by name, and the ``construction`` options no knob sets (checkpoint, device)."""
        own = {f.name for f in fields(cls)}
        taken = {f.name: getattr(settings, f.name) for f in fields(settings) if f.name in own}
        return cls(**taken, **construction)

    def __post_init__(self) -> None:
        """Settings no model can be built with: coded refusals naming the knob (the handlers
        refuse them at bind time; this guards a record built by hand)."""
        for ok, path, why in (
            (self.compute_dtype in DTYPES, TRAINING_COMPUTE_DTYPE, f"{self.compute_dtype!r}"),
            (
                self.attention_backend in ATTENTIONS,
                TRAINING_ATTENTION_BACKEND,
                f"{self.attention_backend!r}",
            ),
            (self.tensor_parallel_size >= 1, TRAINING_TENSOR_PARALLEL_SIZE, "TP below 1"),
            (
                not self.sequence_parallel or self.tensor_parallel_size > 1,
                TRAINING_SEQUENCE_PARALLEL,
                "sequence parallelism at TP 1",
            ),
        ):
            if not ok:
                raise UnsupportedKnobError(
                    "unsupported_value", f"Megatron cannot be built with {why}", path.path
                )

    def fingerprint(self) -> str:
        return canonical_digest(asdict(self))


def transformer_config(cfg: MegatronConfig, arch: MegatronArch) -> Any:
    """Megatron's ``TransformerConfig`` for the checkpoint and the side's settings."""
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import TransformerConfig

    dtype = getattr(torch, cfg.compute_dtype)
    return TransformerConfig(
        num_layers=arch.num_layers,
        hidden_size=arch.hidden_size,
        num_attention_heads=arch.num_heads,
        num_query_groups=arch.num_kv_heads,
        kv_channels=arch.head_dim,
        ffn_hidden_size=arch.ffn_hidden_size,
        normalization="RMSNorm",
        layernorm_epsilon=arch.norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=arch.qkv_bias,
        qk_layernorm=arch.qk_layernorm,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        params_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        attention_softmax_in_fp32=True,
        tensor_model_parallel_size=cfg.tensor_parallel_size,
        sequence_parallel=cfg.sequence_parallel,
        bias_activation_fusion=cfg.bias_activation_fusion,
        bias_dropout_fusion=cfg.bias_dropout_fusion,
        masked_softmax_fusion=cfg.masked_softmax_fusion,
        apply_rope_fusion=cfg.apply_rope_fusion,
        cross_entropy_loss_fusion=cfg.cross_entropy_loss_fusion,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
        # Every parameter is overwritten from the checkpoint (and then checked): nothing is
        # initialised, on the CPU where the device is the CPU.
        use_cpu_initialization=cfg.device == "cpu",
        perform_initialization=False,
    )


def block_spec(cfg: MegatronConfig, arch: MegatronArch) -> Any:
    """Megatron's local GPT layer spec for every layer, with xconf's modules in its slots
    where asked: SDPA as the core attention, and under sequence parallelism a norm that
    accepts it (``modules.py`` says why each)."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.torch_norm import WrappedTorchNorm
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

    from xconf.adapters.megatron.modules import SdpaAttention, SequenceParallelRMSNorm

    spec = get_gpt_layer_local_spec(qk_layernorm=arch.qk_layernorm, normalization="RMSNorm")
    layer, attention = spec.submodules, spec.submodules.self_attention.submodules
    if cfg.attention_backend == "sdpa":
        attention.core_attention = SdpaAttention
    norm: Any = WrappedTorchNorm
    if cfg.sequence_parallel:
        norm = SequenceParallelRMSNorm
        layer.input_layernorm = layer.pre_mlp_layernorm = norm
        if arch.qk_layernorm:
            attention.q_layernorm = attention.k_layernorm = norm
    return TransformerBlockSubmodules(layer_specs=[spec] * arch.num_layers, layer_norm=norm)


def process_groups(tp_group: Any) -> Any:
    """The model's process groups: ``tp_group`` for tensor parallelism (and the groups that
    equal it when every other degree is 1), a private one-rank group for every other."""
    from megatron.core.process_groups_config import ProcessGroupCollection

    from xconf.adapters.megatron.shims import one_rank_group

    alone = one_rank_group()
    return ProcessGroupCollection(
        tp=tp_group,
        tp_cp=tp_group,
        mp=tp_group,
        pp=alone,
        cp=alone,
        embd=alone,
        pos_embd=alone,
        dp=alone,
        dp_cp=alone,
    )


def build_model(cfg: MegatronConfig, arch: MegatronArch, tp_group: Any) -> tuple[Any, WeightCheck]:
    """The model on this rank, its weights loaded and proven equal to the checkpoint's (the
    proof is returned with it)."""
    import torch

    from xconf.adapters.megatron.shims import megatron_on
    from xconf.adapters.megatron.weights import load_weights, verify_weights

    tp, rank = tp_group.size(), tp_group.rank()
    if tp != cfg.tensor_parallel_size:
        raise ModelFactoryError(
            "megatron.group_size",
            f"the tensor-parallel group has {tp} ranks, the settings ask for "
            f"{cfg.tensor_parallel_size}",
            TRAINING_TENSOR_PARALLEL_SIZE.path,
        )
    with megatron_on(cfg.device):
        from megatron.core.models.gpt.gpt_model import GPTModel

        model = GPTModel(
            config=transformer_config(cfg, arch),
            transformer_layer_spec=block_spec(cfg, arch),
            vocab_size=arch.vocab_size,
            max_sequence_length=arch.max_positions,
            position_embedding_type="rope",
            rotary_base=arch.rope_theta,
            share_embeddings_and_output_weights=arch.tied_embeddings,
            parallel_output=True,
            pg_collection=process_groups(tp_group),
        )
        # Every parameter in the compute dtype, as Megatron's Float16Module casts the model for
        # bf16/fp16 (the torch norms of the local spec are built in float32).
        model.to(device=cfg.device, dtype=getattr(torch, cfg.compute_dtype))
        load_weights(model, cfg.model_path, arch, tp, rank)
    check = verify_weights(model, cfg.model_path, arch, tp, rank)
    if not check.ok:
        raise ModelFactoryError(
            "megatron.weights_mismatch",
            f"{len(check.mismatched)} parameter(s) differ from their checkpoint slices after "
            f"loading: {list(check.mismatched)[:5]}",
            cfg.model_path,
        )
    model.eval()
    return model, check
