"""A vLLM engine's live state: what the rollout handlers read each knob's value from.

The engine reports its resolved ``vllm_config``, what its scored pass was served (prefix
cache hits, the requests it answered) and, through ``collective_rpc``, each worker's loaded
model; it names no knob. The knobs are read from this by the vLLM side's handlers
(``handlers.py``, reading through ``reads.py``); ``readings()`` is what the engine reports
beside them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from xconf.runtime.readback import (
    ROLLOUT_BLOCK_SIZE,
    ROLLOUT_COMPILATION_MODE,
    ROLLOUT_CUDAGRAPH_MODE,
    ROLLOUT_DECODE_CONTEXT_PARALLEL_SIZE,
    ROLLOUT_DEVICE,
    ROLLOUT_ENGINE_LOGPROBS_MODE,
    ROLLOUT_KV_CACHE_MEMORY_BYTES,
    ROLLOUT_MAX_MODEL_LEN,
    ROLLOUT_PREFIX_CACHE_HITS,
    ROLLOUT_REQUEST_SIZES,
    ROLLOUT_SEED,
    ROLLOUT_TOKENIZER_REUSED,
    ROLLOUT_WEIGHT_SYNC_LIVE,
    ROLLOUT_WEIGHT_SYNC_LOSSLESS,
    ROLLOUT_WEIGHT_SYNC_REFERENCE,
    ROLLOUT_WEIGHT_SYNC_SENT,
    ROLLOUT_WEIGHT_SYNC_SOURCE,
    ROLLOUT_WEIGHT_SYNC_STALE,
    ROLLOUT_WORKERS,
    ROLLOUT_WORKERS_ERROR,
    ROLLOUT_WORLD_SIZE,
)

if TYPE_CHECKING:
    from xconf.adapters.vllm.weight_sync import SyncRecord


@dataclass(frozen=True)
class VllmState:
    """One reading of a live vLLM engine, taken after its scored pass."""

    config: Any  # the engine's resolved vllm.config.VllmConfig
    # Prompt tokens the scored pass took from the prefix cache (None: not scored yet).
    prefix_cache_hits: int | None
    request_sizes: tuple[int, ...]  # requests the engine answered per generate call
    requested_batch_size: int | None  # the chunking of the last score call
    workers: tuple[dict[str, Any], ...] | None  # each worker's state; None: not read
    workers_error: str | None = None  # why the workers were not read
    tokenizer_reused: bool | None = None  # from vLLM's per-process cache; None: not known
    scoring_mode: str | None = None  # how the last score call asked: decode or prefill
    weight_sync: SyncRecord | None = None  # what a weight sync did; None: loaded from disk
    checkpoint_dtype: str | None = None  # the dtype a loaded checkpoint's weights came in

    def readings(self) -> dict[str, Any]:
        """What the engine reports beside its knobs (``runtime/readback`` names)."""
        vc = self.config
        mc, cc, pc, comp = (
            vc.model_config,
            vc.cache_config,
            vc.parallel_config,
            vc.compilation_config,
        )
        mode = getattr(comp, "mode", None)
        out: dict[str, Any] = {
            ROLLOUT_PREFIX_CACHE_HITS.name: self.prefix_cache_hits,
            ROLLOUT_COMPILATION_MODE.name: getattr(mode, "name", str(mode)),
            ROLLOUT_CUDAGRAPH_MODE.name: str(getattr(comp, "cudagraph_mode", None)),
            ROLLOUT_WORLD_SIZE.name: int(pc.world_size),
            ROLLOUT_BLOCK_SIZE.name: int(cc.block_size),
            ROLLOUT_KV_CACHE_MEMORY_BYTES.name: cc.kv_cache_memory_bytes,
            ROLLOUT_ENGINE_LOGPROBS_MODE.name: str(mc.logprobs_mode),
            ROLLOUT_MAX_MODEL_LEN.name: int(mc.max_model_len),
            ROLLOUT_SEED.name: mc.seed,
            ROLLOUT_DEVICE.name: str(vc.device_config.device_type),
            ROLLOUT_DECODE_CONTEXT_PARALLEL_SIZE.name: int(
                getattr(pc, "decode_context_parallel_size", 1)
            ),
            ROLLOUT_REQUEST_SIZES.name: list(self.request_sizes),
            ROLLOUT_WORKERS.name: None if self.workers is None else list(self.workers),
            ROLLOUT_TOKENIZER_REUSED.name: self.tokenizer_reused,
        }
        if self.workers is None:
            out[ROLLOUT_WORKERS_ERROR.name] = self.workers_error
        sync = self.weight_sync
        if sync is not None:
            out[ROLLOUT_WEIGHT_SYNC_SOURCE.name] = f"{sync.source_rule} sha256:{sync.source_digest}"
            out[ROLLOUT_WEIGHT_SYNC_SENT.name] = f"sha256:{sync.sent_digest}"
            out[ROLLOUT_WEIGHT_SYNC_LIVE.name] = sync.live_digest
            out[ROLLOUT_WEIGHT_SYNC_REFERENCE.name] = sync.reference_digest
            out[ROLLOUT_WEIGHT_SYNC_STALE.name] = ",".join(sync.stale)
            out[ROLLOUT_WEIGHT_SYNC_LOSSLESS.name] = sync.lossless
        return out
