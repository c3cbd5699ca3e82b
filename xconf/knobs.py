"""The knob allowlist: each knob's lifecycle, value type and aliases, and normalization."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal, get_args

from xconf.runtime.readback import DERIVED_NAMES, ROLLOUT_PREFIX_CACHE_HITS

KnobValue = bool | int | float | str
Lifecycle = Literal["request", "engine_construction", "process"]
ValueKind = Literal[
    "positive_int",
    "positive_float",
    "nonnegative_float",
    "top_k",
    "probability",
    "bool",
    "dtype",
    "choice",
    "backend_id",
    "arm",
]

# Lifecycles ordered from cheapest to most expensive to change.
LIFECYCLE_ORDER: tuple[Lifecycle, ...] = ("request", "engine_construction", "process")

# The compute dtypes every side and operator understands, most precise first (the operator
# contract's logits dtypes are this same list: xconf.operators.capability imports it).
Dtype = Literal["float32", "bfloat16", "float16"]
DTYPES: tuple[Dtype, ...] = get_args(Dtype)

DTYPE_ALIASES: Mapping[str, str] = MappingProxyType(
    {
        "float32": "float32",
        "fp32": "float32",
        "f32": "float32",
        "float": "float32",
        "torch.float32": "float32",
        "bfloat16": "bfloat16",
        "bf16": "bfloat16",
        "torch.bfloat16": "bfloat16",
        "float16": "float16",
        "fp16": "float16",
        "f16": "float16",
        "half": "float16",
        "torch.float16": "float16",
    }
)


@dataclass(frozen=True)
class KnobSpec:
    """One allow-listed knob. ``choices`` maps every accepted spelling to its canonical value."""

    path: str
    lifecycle: Lifecycle
    kind: ValueKind
    side: Literal["rollout", "training", "both"]
    meaning: str
    choices: Mapping[str, str] | None = None
    critical: bool = True  # an unobservable critical knob is refused under strict execution
    # "contract": the drift contract's allowlist (v1 documents take exactly these);
    # "extended": accepted by Hydra experiments and v2 documents only.
    tier: Literal["contract", "extended"] = "contract"
    # Engine readings (not knobs) that decide how this knob reads back; a value that differs
    # from the one set is reported with them, so the reason says why.
    evidence_readings: tuple[str, ...] = ()


def _choices(mapping: dict[str, str]) -> Mapping[str, str]:
    return MappingProxyType(mapping)


# An FSDP2 MixedPrecisionPolicy dtype: a dtype, or no policy ("none", "native", "auto").
POLICY_DTYPE_ALIASES = _choices({**DTYPE_ALIASES, "none": "none", "native": "none", "auto": "none"})


# One handle per knob: code names a knob by its handle (``ROLLOUT_DTYPE.path``), never by
# a string, so each path is spelled once, here.
BATCH_SIZE = KnobSpec("batch.size", "request", "positive_int", "both", "samples per request")
ROLLOUT_TENSOR_PARALLEL_SIZE = KnobSpec(
    "rollout.tensor_parallel_size",
    "process",
    "positive_int",
    "rollout",
    "rollout tensor-parallel world",
)
ROLLOUT_CONTEXT_PARALLEL_SIZE = KnobSpec(
    "rollout.context_parallel_size",
    "process",
    "positive_int",
    "rollout",
    "rollout context-parallel world",
)
ROLLOUT_DTYPE = KnobSpec(
    "rollout.dtype",
    "engine_construction",
    "dtype",
    "rollout",
    "rollout numerical dtype",
)
ROLLOUT_ENABLE_PREFIX_CACHING = KnobSpec(
    "rollout.enable_prefix_caching",
    "engine_construction",
    "bool",
    "rollout",
    "engine prefix-cache policy",
    # On only when the scored pass hit the cache (a prompt under one KV block: 0).
    evidence_readings=(ROLLOUT_PREFIX_CACHE_HITS.name,),
)
ROLLOUT_ENFORCE_EAGER = KnobSpec(
    "rollout.enforce_eager",
    "engine_construction",
    "bool",
    "rollout",
    "eager versus optimized/graph path",
)
TRAINING_ATTENTION_BACKEND = KnobSpec(
    "training.attention_backend",
    "engine_construction",
    "choice",
    "training",
    "training scorer attention implementation",
    _choices(
        {
            "eager": "eager",
            "sdpa": "sdpa",
            "flash_attention_2": "flash_attention_2",
            "flash_attention": "flash_attention_2",
            "fa2": "flash_attention_2",
            "native": "native",
            "auto": "native",
            "default": "native",
        }
    ),
)
TRAINING_COMPUTE_DTYPE = KnobSpec(
    "training.compute_dtype",
    "engine_construction",
    "dtype",
    "training",
    "training scorer compute dtype",
)
TRAINING_SHARDING = KnobSpec(
    "training.sharding",
    "process",
    "choice",
    "training",
    "training topology",
    _choices(
        {
            "unsharded": "unsharded",
            "none": "unsharded",
            "single": "unsharded",
            "fsdp": "fsdp",
            "fsdp2": "fsdp",  # FSDP is FSDP2 (fully_shard); one canonical spelling
        }
    ),
)
LOGP_BACKEND = KnobSpec(
    "logp.backend",
    "engine_construction",
    "backend_id",
    "both",
    "selected-logprob backend on both sides",
)
# -- extended knobs (beyond the drift contract): Hydra and v2 documents only ----
ROLLOUT_KV_CACHE_DTYPE = KnobSpec(
    "rollout.kv_cache_dtype",
    "engine_construction",
    "choice",
    "rollout",
    "dtype of the rollout engine's paged KV cache",
    _choices(
        {
            "auto": "auto",
            "default": "auto",
            "native": "auto",
            "fp8": "fp8",
            "fp8_e4m3": "fp8_e4m3",
            "fp8_e5m2": "fp8_e5m2",
            "bfloat16": "bfloat16",
            "bf16": "bfloat16",
            "float16": "float16",
            "fp16": "float16",
        }
    ),
    tier="extended",
)
ROLLOUT_ENABLE_CHUNKED_PREFILL = KnobSpec(
    "rollout.enable_chunked_prefill",
    "engine_construction",
    "bool",
    "rollout",
    "split long prefills into token-budget chunks",
    tier="extended",
)
ROLLOUT_MAX_NUM_BATCHED_TOKENS = KnobSpec(
    "rollout.max_num_batched_tokens",
    "engine_construction",
    "positive_int",
    "rollout",
    "tokens the rollout scheduler batches per step",
    tier="extended",
)
ROLLOUT_BATCH_INVARIANT = KnobSpec(
    "rollout.batch_invariant",
    "engine_construction",
    "bool",
    "rollout",
    "vLLM's batch-invariant kernels (VLLM_BATCH_INVARIANT)",
    tier="extended",
)
TRAINING_PARAM_DTYPE = KnobSpec(
    "training.param_dtype",
    "engine_construction",
    "choice",
    "training",
    "FSDP2 MixedPrecisionPolicy.param_dtype (none: no policy)",
    POLICY_DTYPE_ALIASES,
    tier="extended",
)
TRAINING_REDUCE_DTYPE = KnobSpec(
    "training.reduce_dtype",
    "engine_construction",
    "choice",
    "training",
    "FSDP2 MixedPrecisionPolicy.reduce_dtype (none: no policy)",
    POLICY_DTYPE_ALIASES,
    tier="extended",
)
TRAINING_REMOVE_PADDING = KnobSpec(
    "training.remove_padding",
    "engine_construction",
    "bool",
    "training",
    "score packed variable-length sequences instead of a padded batch",
    tier="extended",
)

# Megatron's training side (adapters/megatron): its parallelism and its fusion switches, each
# a field of Megatron's TransformerConfig of the same name. A runtime without them reports
# them unsupported (no handler).
TRAINING_TENSOR_PARALLEL_SIZE = KnobSpec(
    "training.tensor_parallel_size",
    "process",
    "positive_int",
    "training",
    "training tensor-parallel world (Megatron: heads, MLP and vocabulary split over ranks)",
    tier="extended",
)
TRAINING_SEQUENCE_PARALLEL = KnobSpec(
    "training.sequence_parallel",
    "engine_construction",
    "bool",
    "training",
    "Megatron sequence parallelism (norms and residuals split along the sequence over TP)",
    tier="extended",
)
TRAINING_BIAS_ACTIVATION_FUSION = KnobSpec(
    "training.bias_activation_fusion",
    "engine_construction",
    "bool",
    "training",
    "Megatron's fused bias + activation (SwiGLU) kernel",
    tier="extended",
)
TRAINING_BIAS_DROPOUT_FUSION = KnobSpec(
    "training.bias_dropout_fusion",
    "engine_construction",
    "bool",
    "training",
    "Megatron's fused bias + dropout + residual-add kernel",
    tier="extended",
)
TRAINING_MASKED_SOFTMAX_FUSION = KnobSpec(
    "training.masked_softmax_fusion",
    "engine_construction",
    "bool",
    "training",
    "Megatron's fused scale + mask + softmax attention kernel",
    tier="extended",
)
TRAINING_APPLY_ROPE_FUSION = KnobSpec(
    "training.apply_rope_fusion",
    "engine_construction",
    "bool",
    "training",
    "Megatron's fused rotary-embedding kernel",
    tier="extended",
)
TRAINING_CROSS_ENTROPY_LOSS_FUSION = KnobSpec(
    "training.cross_entropy_loss_fusion",
    "engine_construction",
    "bool",
    "training",
    "Megatron's fused vocab-parallel cross entropy (its native selected logprob)",
    tier="extended",
)
# -- replacement arms (docs/arms.md): the training model computes a kind of module as vLLM --
# The kinds in the order a decoder layer first computes them (input norm, q/k/v projection,
# rotary, attention, MLP activation; the logits last); each kind is one knob,
# ``training.align.all`` the full arm.
ALIGN_KINDS: tuple[str, ...] = ("rms_norm", "linear", "rotary", "attention", "activation", "logits")
ALIGN_OFF, ALIGN_VLLM = "off", "vllm"
ALIGN_PREFIX = "training.align"  # the arms' knobs: ``training.align.<kind>``, ``...all``
# YAML reads a bare ``off`` as false: both spellings are the trainer's own kernels.
ARM_CHOICES = _choices({"off": ALIGN_OFF, "none": ALIGN_OFF, "hf": ALIGN_OFF, "vllm": ALIGN_VLLM})


def _arm(path: str, meaning: str) -> KnobSpec:
    return KnobSpec(
        path, "engine_construction", "arm", "training", meaning, ARM_CHOICES, tier="extended"
    )


TRAINING_ALIGN_RMS_NORM = _arm(
    "training.align.rms_norm", "RMS norms (and the fused residual adds) computed as vLLM does"
)
TRAINING_ALIGN_LINEAR = _arm(
    "training.align.linear", "linear layers through vLLM's GEMM path and fused weight layout"
)
TRAINING_ALIGN_ROTARY = _arm(
    "training.align.rotary", "rotary embedding with vLLM's cos/sin cache and kernel"
)
TRAINING_ALIGN_ATTENTION = _arm(
    "training.align.attention", "attention as vLLM's CPU kernel over a paged KV cache"
)
TRAINING_ALIGN_ACTIVATION = _arm(
    "training.align.activation", "the MLP activation as vLLM's SiluAndMul"
)
TRAINING_ALIGN_LOGITS = _arm(
    "training.align.logits",
    "logits through vLLM's logits processor, logprobs as its sampler computes them",
)
# One knob per kind, keyed by the kind (``ALIGN_KINDS`` order).
TRAINING_ALIGN: Mapping[str, KnobSpec] = MappingProxyType(
    {
        "rms_norm": TRAINING_ALIGN_RMS_NORM,
        "linear": TRAINING_ALIGN_LINEAR,
        "rotary": TRAINING_ALIGN_ROTARY,
        "attention": TRAINING_ALIGN_ATTENTION,
        "activation": TRAINING_ALIGN_ACTIVATION,
        "logits": TRAINING_ALIGN_LOGITS,
    }
)
TRAINING_ALIGN_ALL = _arm(
    "training.align.all", "the full arm: every kind of module computed as vLLM does"
)
TRAINING_SCORING_MODE = KnobSpec(
    "training.scoring_mode",
    "engine_construction",
    "choice",
    "training",
    "teacher-forced single forward (full) or token by token over a KV cache (decode)",
    _choices({"full": "full", "teacher_forced": "full", "decode": "decode"}),
    tier="extended",
)
ROLLOUT_SCORING_MODE = KnobSpec(
    "rollout.scoring_mode",
    "engine_construction",
    "choice",
    "rollout",
    "forced decoding (decode) or prompt logprobs in one pass (prefill)",
    _choices({"decode": "decode", "prefill": "prefill"}),
    tier="extended",
)

# -- remedies users try in real loops (docs/arms.md): the lm_head's output dtype ------------
# ``model``: the head computes in the side's compute dtype; ``float32``: hidden states and the
# head's weight cast to float32 first (vLLM: ``hf_overrides={"head_dtype": "float32"}``).
# Both sides' log-softmax is float32 already.
LOGITS_MODEL, LOGITS_FLOAT32 = "model", "float32"
LOGITS_DTYPE_CHOICES = _choices(
    {"model": LOGITS_MODEL, "auto": LOGITS_MODEL, "float32": LOGITS_FLOAT32, "fp32": LOGITS_FLOAT32}
)
ROLLOUT_LOGITS_DTYPE = KnobSpec(
    "rollout.logits_dtype",
    "engine_construction",
    "choice",
    "rollout",
    "dtype of the rollout's lm_head projection (model: its compute dtype, or float32)",
    LOGITS_DTYPE_CHOICES,
    tier="extended",
)
TRAINING_LOGITS_DTYPE = KnobSpec(
    "training.logits_dtype",
    "engine_construction",
    "choice",
    "training",
    "dtype of the trainer's lm_head projection (model: its compute dtype, or float32)",
    LOGITS_DTYPE_CHOICES,
    tier="extended",
)

# The temperature the trainer divides its logits by before the log-softmax (verl's actor:
# ``logits.div_(temperature)``); 1.0: the logits as the model computes them.
TRAINING_TEMPERATURE = KnobSpec(
    "training.temperature",
    "engine_construction",
    "positive_float",
    "training",
    "temperature the trainer divides its logits by before the log-softmax (1.0: none)",
    tier="extended",
)
# The largest temperature a knob accepts: beyond it every logprob is about -log(vocabulary).
MAX_TEMPERATURE = 100.0

# -- the rollout's logprobs and sampling (docs/arms.md, "Remedy knobs") ---------------------
# What vLLM reports for a token: ``raw_logprobs`` (log-softmax of the model's logits, before
# any temperature, top-k/top-p or logits processor) or ``processed_logprobs`` (after them).
# vLLM's ``raw_logits``/``processed_logits`` report logits, not logprobs: they are how an
# injected operator gets its rows (``logp.backend``: the operator binding's), not values here.
RAW_LOGPROBS, PROCESSED_LOGPROBS = "raw_logprobs", "processed_logprobs"
ROLLOUT_LOGPROBS_MODE = KnobSpec(
    "rollout.logprobs_mode",
    "engine_construction",
    "choice",
    "rollout",
    "the rollout's logprobs: raw (before temperature and top-k/top-p) or processed (after)",
    _choices(
        {
            "raw_logprobs": RAW_LOGPROBS,
            "raw": RAW_LOGPROBS,
            "processed_logprobs": PROCESSED_LOGPROBS,
            "processed": PROCESSED_LOGPROBS,
        }
    ),
    tier="extended",
)
# The sampling the rollout's scoring requests ask with (vLLM's SamplingParams). xconf builds
# the side per value (engine construction); vLLM takes them per request.
ROLLOUT_TEMPERATURE = KnobSpec(
    "rollout.temperature",
    "engine_construction",
    "nonnegative_float",
    "rollout",
    "the rollout's sampling temperature (0: greedy, what xconf's forced decoding asks)",
    tier="extended",
)
ROLLOUT_TOP_K = KnobSpec(
    "rollout.top_k",
    "engine_construction",
    "top_k",
    "rollout",
    "the rollout's top-k (0, or -1 as verl writes it: every token)",
    tier="extended",
)
ROLLOUT_TOP_P = KnobSpec(
    "rollout.top_p",
    "engine_construction",
    "probability",
    "rollout",
    "the rollout's top-p (nucleus) probability mass (1.0: every token)",
    tier="extended",
)
# The largest top-k a knob accepts (above any vocabulary here; vLLM: >= vocab is no top-k).
MAX_TOP_K = 1 << 20

# How the rollout engine comes to hold the scored weights (docs/weight_sync.md): ``load``
# builds it from the scored checkpoint; ``reload`` builds it from another checkpoint (the
# scored one under a recorded, deterministic perturbation) and then sends it the scored
# weights through vLLM's weight-update path (``reload_weights``), as an RL loop does.
WEIGHT_SYNC_LOAD = "load"
WEIGHT_SYNC_RELOAD = "reload"
ROLLOUT_WEIGHT_SYNC = KnobSpec(
    "rollout.weight_sync",
    "engine_construction",
    "choice",
    "rollout",
    "how the rollout engine receives the scored weights (load: from disk at construction; "
    "reload: built from another checkpoint, then synced through vLLM's weight-update path)",
    _choices({WEIGHT_SYNC_LOAD: WEIGHT_SYNC_LOAD, WEIGHT_SYNC_RELOAD: WEIGHT_SYNC_RELOAD}),
    tier="extended",
)
ROLLOUT_WEIGHT_SYNC_DTYPE = KnobSpec(
    "rollout.weight_sync_dtype",
    "engine_construction",
    "choice",
    "rollout",
    "dtype the synced weights travel in (the trainer's float32 master weights, or bfloat16)",
    _choices({k: v for k, v in DTYPE_ALIASES.items() if v in ("float32", "bfloat16")}),
    tier="extended",
)

KNOBS: Mapping[str, KnobSpec] = MappingProxyType(
    {
        spec.path: spec
        for spec in (
            BATCH_SIZE,
            ROLLOUT_TENSOR_PARALLEL_SIZE,
            ROLLOUT_CONTEXT_PARALLEL_SIZE,
            ROLLOUT_DTYPE,
            ROLLOUT_ENABLE_PREFIX_CACHING,
            ROLLOUT_ENFORCE_EAGER,
            TRAINING_ATTENTION_BACKEND,
            TRAINING_COMPUTE_DTYPE,
            TRAINING_SHARDING,
            LOGP_BACKEND,
            ROLLOUT_KV_CACHE_DTYPE,
            ROLLOUT_ENABLE_CHUNKED_PREFILL,
            ROLLOUT_MAX_NUM_BATCHED_TOKENS,
            ROLLOUT_BATCH_INVARIANT,
            TRAINING_PARAM_DTYPE,
            TRAINING_REDUCE_DTYPE,
            TRAINING_REMOVE_PADDING,
            TRAINING_TENSOR_PARALLEL_SIZE,
            TRAINING_SEQUENCE_PARALLEL,
            TRAINING_BIAS_ACTIVATION_FUSION,
            TRAINING_BIAS_DROPOUT_FUSION,
            TRAINING_MASKED_SOFTMAX_FUSION,
            TRAINING_APPLY_ROPE_FUSION,
            TRAINING_CROSS_ENTROPY_LOSS_FUSION,
            *TRAINING_ALIGN.values(),
            TRAINING_ALIGN_ALL,
            TRAINING_SCORING_MODE,
            ROLLOUT_SCORING_MODE,
            ROLLOUT_LOGITS_DTYPE,
            TRAINING_LOGITS_DTYPE,
            TRAINING_TEMPERATURE,
            ROLLOUT_LOGPROBS_MODE,
            ROLLOUT_TEMPERATURE,
            ROLLOUT_TOP_K,
            ROLLOUT_TOP_P,
            ROLLOUT_WEIGHT_SYNC,
            ROLLOUT_WEIGHT_SYNC_DTYPE,
        )
    }
)

# The drift contract's allowlist: exactly what a v1 document may name.
CONTRACT_KNOBS: frozenset[str] = frozenset(p for p, s in KNOBS.items() if s.tier == "contract")
EXTENDED_KNOBS: frozenset[str] = frozenset(KNOBS) - CONTRACT_KNOBS

# Names the framework derives and records; a config may never set them (the readback
# names' own table owns them).
DERIVED_KNOBS: frozenset[str] = DERIVED_NAMES


class KnobValueError(ValueError):
    """A value that a knob cannot take; the message says why."""


def normalize_value(spec: KnobSpec, raw: object) -> KnobValue:
    """The canonical value of ``raw`` for ``spec``; raises KnobValueError otherwise."""
    if spec.kind == "positive_int":
        if isinstance(raw, bool) or not isinstance(raw, int):
            if isinstance(raw, float) and math.isfinite(raw) and raw.is_integer():
                raw = int(raw)
            else:
                raise KnobValueError(f"expected a positive integer, got {raw!r}")
        if raw < 1:
            raise KnobValueError(f"expected a positive integer, got {raw!r}")
        if raw > 4096:
            raise KnobValueError(f"{raw} is beyond any supported size (4096)")
        return raw
    if spec.kind in ("positive_float", "nonnegative_float"):
        if isinstance(raw, bool) or not isinstance(raw, int | float):
            raise KnobValueError(f"expected a number, got {raw!r}")
        value = float(raw)
        if (
            not math.isfinite(value)
            or value < 0.0
            or (value == 0.0 and spec.kind != "nonnegative_float")
        ):
            least = "0 or above" if spec.kind == "nonnegative_float" else "above 0"
            raise KnobValueError(f"expected a finite number {least}, got {raw!r}")
        if value > MAX_TEMPERATURE:
            raise KnobValueError(f"{raw} is beyond any meaningful temperature ({MAX_TEMPERATURE})")
        return value
    if spec.kind == "top_k":
        if isinstance(raw, float) and math.isfinite(raw) and raw.is_integer():
            raw = int(raw)
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise KnobValueError(f"expected an integer, got {raw!r}")
        if raw < -1 or raw > MAX_TOP_K:
            raise KnobValueError(f"expected 0 or -1 (every token) or 1 to {MAX_TOP_K}, got {raw!r}")
        return max(raw, 0)  # -1 (verl's spelling) and 0 (vLLM's) both mean every token
    if spec.kind == "probability":
        if isinstance(raw, bool) or not isinstance(raw, int | float):
            raise KnobValueError(f"expected a number, got {raw!r}")
        value = float(raw)
        if not (math.isfinite(value) and 0.0 < value <= 1.0):
            raise KnobValueError(f"expected a probability above 0, at most 1, got {raw!r}")
        return value
    if spec.kind == "bool":
        if not isinstance(raw, bool):
            raise KnobValueError(f"expected true or false, got {raw!r}")
        return raw
    if spec.kind == "arm" and raw is False:
        return ALIGN_OFF  # YAML's bare ``off``
    if not isinstance(raw, str):
        raise KnobValueError(f"expected a string, got {raw!r}")
    cleaned = raw.strip().lower()
    if spec.kind == "dtype":
        if cleaned not in DTYPE_ALIASES:
            raise KnobValueError(f"unsupported dtype {raw!r}; use float32, bfloat16 or float16")
        return DTYPE_ALIASES[cleaned]
    if spec.kind in ("choice", "arm"):
        choices = spec.choices or {}
        if cleaned not in choices:
            allowed = ", ".join(sorted(set(choices.values())))
            raise KnobValueError(f"unsupported value {raw!r}; use one of: {allowed}")
        return choices[cleaned]
    if not cleaned:
        raise KnobValueError("expected a backend id, got an empty string")
    return normalize_backend_id(cleaned)


def canonical(path: str, raw: object) -> KnobValue:
    """The canonical value of knob ``path``; raises KeyError (unknown) or KnobValueError."""
    return normalize_value(KNOBS[path], raw)


def flatten_knobs(tree: Mapping[str, object], prefix: str = "") -> dict[str, object]:
    """A nested knob tree as flat paths: ``{"rollout": {"dtype": "bf16"}}`` -> one key,
    ``rollout.dtype``, with the value ``"bf16"``."""
    flat: dict[str, object] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_knobs(value, path + "."))
        else:
            flat[path] = value
    return flat


def side_dtype(knobs: Mapping[str, KnobValue], side: Literal["rollout", "training"]) -> str:
    return str(knobs[(ROLLOUT_DTYPE if side == "rollout" else TRAINING_COMPUTE_DTYPE).path])


# -- process topology, per side ------------------------------------------------------------
# FSDP shards the training model over a fixed group of this many ranks, Megatron over its
# tensor-parallel size: the training side's process group is set by the training knobs
# alone, never by the rollout's parallelism.
FSDP_DEGREE = 2
_TRAINING_WORLD: Mapping[str, int] = MappingProxyType({"unsharded": 1, "fsdp": FSDP_DEGREE})


@dataclass(frozen=True)
class SideWorlds:
    """Ranks each side's process group spans; the launcher starts ``launched`` ranks.

    Each side runs on the sub-group of ranks ``0 .. world - 1`` of the launched world, so
    changing a rollout knob never changes the training group (and vice versa).
    """

    rollout: int
    training: int

    @property
    def launched(self) -> int:
        return max(self.rollout, self.training)

    def of(self, side: Literal["rollout", "training"]) -> int:
        return self.rollout if side == "rollout" else self.training


def side_worlds(knobs: Mapping[str, object]) -> SideWorlds:
    """Each side's world from its own process-lifecycle knobs; a missing knob counts as 1.

    Values are normalized here (``fsdp2`` is ``fsdp``); a value no knob accepts raises
    KnobValueError naming it.
    """

    def value(spec: KnobSpec, default: object) -> KnobValue:
        raw = knobs.get(spec.path)
        return normalize_value(spec, default if raw is None else raw)

    rollout = int(value(ROLLOUT_TENSOR_PARALLEL_SIZE, 1)) * int(
        value(ROLLOUT_CONTEXT_PARALLEL_SIZE, 1)
    )
    training = _TRAINING_WORLD[str(value(TRAINING_SHARDING, "unsharded"))] * int(
        value(TRAINING_TENSOR_PARALLEL_SIZE, 1)
    )
    return SideWorlds(rollout=rollout, training=training)


# Ids from the reference project's JSON documents map to xconf's own backends.
BACKEND_ALIASES: Mapping[str, str] = MappingProxyType(
    {
        "auto": "native",
        "default": "native",
        "rlkernel.reference_logp": "xconf.reference_logp",
        "reference": "xconf.reference_logp",
    }
)


def normalize_backend_id(backend_id: str) -> str:
    """Strip, lower-case and resolve aliases so id-based lookup matches."""
    cleaned = backend_id.strip().lower()
    return BACKEND_ALIASES.get(cleaned, cleaned)
