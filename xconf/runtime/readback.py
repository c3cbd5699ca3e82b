"""Readback names: what a live engine reports beside its knobs' values.

A reading is recorded in ``actual.json`` (the derived ones under ``derived``) and may explain
a knob's status (``KnobSpec.evidence_readings``), but it is never a knob: no config sets it,
no case varies it. Keeping the names here, apart from the knob table (``xconf/knobs.py``),
keeps the two namespaces apart; an engine writes ``ROLLOUT_BLOCK_SIZE.name``, never the
string.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True)
class ReadbackName:
    """One reading of a live engine, and what it measures (with its unit)."""

    name: str
    meaning: str


# -- rollout (vLLM's resolved config and its workers; the hf_pair reference scorer) ---------
ROLLOUT_PREFIX_CACHE_HITS = ReadbackName(
    "rollout.prefix_cache_hits", "prompt tokens the scored pass took from the prefix cache"
)
ROLLOUT_COMPILATION_MODE = ReadbackName("rollout.compilation_mode", "vLLM's compilation mode")
ROLLOUT_CUDAGRAPH_MODE = ReadbackName("rollout.cudagraph_mode", "vLLM's CUDA-graph mode")
ROLLOUT_WORLD_SIZE = ReadbackName("rollout.world_size", "ranks of the rollout engine's world")
ROLLOUT_BLOCK_SIZE = ReadbackName("rollout.block_size", "tokens per paged KV-cache block")
ROLLOUT_KV_CACHE_MEMORY_BYTES = ReadbackName(
    "rollout.kv_cache_memory_bytes", "bytes reserved for the KV cache"
)
ROLLOUT_ENGINE_LOGPROBS_MODE = ReadbackName(
    "rollout.engine_logprobs_mode",
    "vLLM's logprobs_mode as built: raw_logprobs, processed_logprobs, or raw_logits (an "
    "injected operator's rows); the knob rollout.logprobs_mode reads back from its sampler",
)
ROLLOUT_MAX_MODEL_LEN = ReadbackName("rollout.max_model_len", "context length in tokens")
ROLLOUT_SEED = ReadbackName("rollout.seed", "the engine's seed")
ROLLOUT_DEVICE = ReadbackName("rollout.device", "the engine's device type")
ROLLOUT_DECODE_CONTEXT_PARALLEL_SIZE = ReadbackName(
    "rollout.decode_context_parallel_size", "decode context-parallel ranks"
)
ROLLOUT_REQUEST_SIZES = ReadbackName(
    "rollout.request_sizes", "requests the engine answered per generate call"
)
ROLLOUT_WORKERS = ReadbackName("rollout.workers", "each vLLM worker's state (collective_rpc)")
ROLLOUT_WORKERS_ERROR = ReadbackName("rollout.workers_error", "why the workers were not read")
ROLLOUT_WORKER_STATE = ReadbackName("rollout.worker_state", "the workers' state, as recorded")
ROLLOUT_VOCAB_LAYOUT = ReadbackName(
    "rollout.vocab_layout", "the output vocabulary as the engine built it (shards per TP rank)"
)
ROLLOUT_TOKENIZER_REUSED = ReadbackName(
    "rollout.tokenizer_reused",
    "the engine's tokenizer came from vLLM's per-process cache (an earlier engine of this "
    "process loaded it from the same files and options); it never touches a score",
)
ROLLOUT_WEIGHT_SYNC_SOURCE = ReadbackName(
    "rollout.weight_sync_source",
    "the checkpoint a synced engine was built from: its perturbation rule and the sha256 of "
    "its weights file (rollout.weight_sync=reload)",
)
ROLLOUT_WEIGHT_SYNC_SENT = ReadbackName(
    "rollout.weight_sync_sent", "sha256 of the weights file the sync sent"
)
ROLLOUT_WEIGHT_SYNC_LIVE = ReadbackName(
    "rollout.weight_sync_live_digest",
    "digest of every worker's parameters and buffers after the sync",
)
ROLLOUT_WEIGHT_SYNC_REFERENCE = ReadbackName(
    "rollout.weight_sync_reference_digest",
    "the same digest, of an engine that loaded the weights as sent from disk",
)
ROLLOUT_WEIGHT_SYNC_STALE = ReadbackName(
    "rollout.weight_sync_stale",
    "worker:tensor names the sync left different from the reference (empty: none)",
)
ROLLOUT_WEIGHT_SYNC_LOSSLESS = ReadbackName(
    "rollout.weight_sync_lossless",
    "the weights as sent equal the scored checkpoint's bit for bit (false: the transport "
    "dtype rounded them)",
)
ROLLOUT_ATTENTION_BACKEND = ReadbackName(
    "rollout.attention_backend", "the hf_pair reference scorer's attention implementation"
)
# -- training (the transformers scorer: its model, FSDP2 state and forwards) ----------------
TRAINING_FSDP_WRAPPED_MODULES = ReadbackName(
    "training.fsdp_wrapped_modules", "modules FSDP2 wrapped (fully_shard)"
)
TRAINING_WORLD_SIZE = ReadbackName(
    "training.world_size",
    "ranks the parameters are sharded over (the FSDP mesh, or Megatron's tensor-parallel group)",
)
TRAINING_LAUNCHER_WORLD_SIZE = ReadbackName(
    "training.launcher_world_size", "ranks of the launched torch.distributed world"
)
TRAINING_DEVICE = ReadbackName("training.device", "the parameters' device")
TRAINING_MODEL_CLASS = ReadbackName("training.model_class", "the loaded model's class")
TRAINING_VOCAB_LAYOUT = ReadbackName(
    "training.vocab_layout", "the output vocabulary as the lm_head is built"
)
TRAINING_STATE_DIGEST = ReadbackName(
    "training.state_digest", "digest of the parameters and buffers after scoring"
)
TRAINING_REQUEST_SIZES = ReadbackName("training.request_sizes", "samples per forward, per request")
# -- training (Megatron: adapters/megatron) --------------------------------------------------
TRAINING_WEIGHTS_VERIFIED = ReadbackName(
    "training.weights_verified",
    "parameters proven bit-equal to their checkpoint slices after loading (this rank's)",
)
TRAINING_CROSS_ENTROPY = ReadbackName(
    "training.cross_entropy",
    "the last call's selected-logprob path: Megatron's fused or unfused vocab-parallel "
    "cross entropy, or an operator",
)
TRAINING_ARM_MODULES = ReadbackName(
    "training.arm_modules",
    "per arm kind, the modules whose live forward computes as vLLM, of those the arms can replace",
)
TRAINING_FORWARD_TOKENS = ReadbackName(
    "training.forward_tokens",
    "tokens each forward of the last scoring call computed, per request (a GEMM's M)",
)

READBACKS: Mapping[str, ReadbackName] = MappingProxyType(
    {
        r.name: r
        for r in (
            ROLLOUT_PREFIX_CACHE_HITS,
            ROLLOUT_COMPILATION_MODE,
            ROLLOUT_CUDAGRAPH_MODE,
            ROLLOUT_WORLD_SIZE,
            ROLLOUT_BLOCK_SIZE,
            ROLLOUT_KV_CACHE_MEMORY_BYTES,
            ROLLOUT_ENGINE_LOGPROBS_MODE,
            ROLLOUT_MAX_MODEL_LEN,
            ROLLOUT_SEED,
            ROLLOUT_DEVICE,
            ROLLOUT_DECODE_CONTEXT_PARALLEL_SIZE,
            ROLLOUT_REQUEST_SIZES,
            ROLLOUT_WORKERS,
            ROLLOUT_WORKERS_ERROR,
            ROLLOUT_WORKER_STATE,
            ROLLOUT_TOKENIZER_REUSED,
            ROLLOUT_VOCAB_LAYOUT,
            ROLLOUT_ATTENTION_BACKEND,
            ROLLOUT_WEIGHT_SYNC_SOURCE,
            ROLLOUT_WEIGHT_SYNC_SENT,
            ROLLOUT_WEIGHT_SYNC_LIVE,
            ROLLOUT_WEIGHT_SYNC_REFERENCE,
            ROLLOUT_WEIGHT_SYNC_STALE,
            ROLLOUT_WEIGHT_SYNC_LOSSLESS,
            TRAINING_FSDP_WRAPPED_MODULES,
            TRAINING_WORLD_SIZE,
            TRAINING_LAUNCHER_WORLD_SIZE,
            TRAINING_DEVICE,
            TRAINING_MODEL_CLASS,
            TRAINING_VOCAB_LAYOUT,
            TRAINING_STATE_DIGEST,
            TRAINING_REQUEST_SIZES,
            TRAINING_WEIGHTS_VERIFIED,
            TRAINING_CROSS_ENTROPY,
            TRAINING_ARM_MODULES,
            TRAINING_FORWARD_TOKENS,
        )
    }
)

# Names the framework derives and records (under actual.json's ``derived``); a config may
# never set them. The last two are no reading today: they are reserved so that a config
# naming them is refused as derived rather than as an unknown knob. (The training TP size was
# reserved here until Megatron's side made it a knob: ``knobs.TRAINING_TENSOR_PARALLEL_SIZE``.)
DERIVED_NAMES: frozenset[str] = frozenset(
    {
        ROLLOUT_VOCAB_LAYOUT.name,
        ROLLOUT_WORLD_SIZE.name,
        TRAINING_VOCAB_LAYOUT.name,
        TRAINING_WORLD_SIZE.name,
        "rollout.vocab_shard_bounds",
        "world_size",
    }
)
