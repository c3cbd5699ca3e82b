"""Construct a vLLM rollout engine from the side's settings and read its live state back.

``RolloutEngineConfig`` holds everything fixed when the engine is built: the side's settings
(``settings.VllmSettings``, copied field by field: ``from_settings``) and the runtime's
process options. Reuse is not its to decide: the engine cache keys engines by the case
binding's fingerprints. ``VllmRolloutEngine.live()`` reports what the constructed engine
actually uses (its resolved ``vllm_config`` and, through ``collective_rpc``, the workers'
loaded model), never the requested values.
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass
from typing import Any

from xconf.adapters.errors import RuntimeUnavailableError, ScoringError, UnsupportedKnobError
from xconf.adapters.vllm import heap, weight_sync
from xconf.adapters.vllm.process import (
    configure_env,
    destroy_vllm_distributed,
    inprocess_executor,
)
from xconf.adapters.vllm.reaper import REAPER, engine_memory_estimate
from xconf.adapters.vllm.settings import VllmSettings
from xconf.adapters.vllm.state import VllmState
from xconf.adapters.vllm.weight_sync import SyncRecord
from xconf.knobs import (
    DTYPES,
    LOGITS_DTYPE_CHOICES,
    LOGITS_FLOAT32,
    PROCESSED_LOGPROBS,
    RAW_LOGPROBS,
    ROLLOUT_DTYPE,
    ROLLOUT_LOGITS_DTYPE,
    ROLLOUT_LOGPROBS_MODE,
    ROLLOUT_TENSOR_PARALLEL_SIZE,
    WEIGHT_SYNC_RELOAD,
)
from xconf.runtime.readback import (
    ROLLOUT_KV_CACHE_MEMORY_BYTES,
)
from xconf.runtime.settings import built_from

FORCED_TOKENS_PROCESSOR = "xconf.adapters.vllm.forcing:ForcedTokensLogitsProcessor"
# The vLLM logprobs modes an engine is built with: the knob's two, and an operator's rows.
ENGINE_LOGPROBS_MODES = (RAW_LOGPROBS, PROCESSED_LOGPROBS, "raw_logits")
DEFAULT_KV_CACHE_BYTES = 64 << 20
# vLLM's in-process EngineCore.shutdown() tears down this process's torch.distributed and
# model-parallel state (cleanup_dist_env_and_memory), which every engine whose core runs in
# this process uses. So at most one such engine is alive: building one closes the others.
_LIVE: weakref.WeakSet[VllmRolloutEngine] = weakref.WeakSet()
# The knob fields' defaults: the side's settings own them (one place).
_SETTINGS = VllmSettings()


@dataclass(frozen=True)
class RolloutEngineConfig:
    """Everything that is fixed when the engine is built (lifecycle: engine, process)."""

    model_path: str
    dtype: str = _SETTINGS.dtype
    enable_prefix_caching: bool = _SETTINGS.enable_prefix_caching
    enforce_eager: bool = _SETTINGS.enforce_eager
    tensor_parallel_size: int = _SETTINGS.tensor_parallel_size
    kv_cache_memory_bytes: int = DEFAULT_KV_CACHE_BYTES
    seed: int = 0
    max_model_len: int = 256
    max_num_seqs: int = 64
    in_process: bool = True
    # raw_logprobs / processed_logprobs: the engine's native selected logprob, before or
    # after its temperature and top-k/top-p (rollout.logprobs_mode). raw_logits: full-
    # vocabulary logits rows are returned so that an injected operator can be applied.
    logprobs_mode: str = _SETTINGS.logprobs_mode
    # The sampling every scoring request asks with (SamplingParams; 0: greedy).
    temperature: float = _SETTINGS.temperature
    top_k: int = _SETTINGS.top_k
    top_p: float = _SETTINGS.top_p
    # auto: in-process (TP 1) or multiprocess workers (TP > 1). external_launcher: this
    # process is one TP rank of a world a launcher (torchrun) already initialised.
    executor: str = "auto"
    # Extended knobs (beyond the drift contract); None leaves vLLM's own default.
    kv_cache_dtype: str = _SETTINGS.kv_cache_dtype
    enable_chunked_prefill: bool | None = _SETTINGS.enable_chunked_prefill
    max_num_batched_tokens: int | None = _SETTINGS.max_num_batched_tokens
    batch_invariant: bool = _SETTINGS.batch_invariant
    logits_dtype: str = _SETTINGS.logits_dtype
    tokenizer_path: str | None = None  # None: the tokenizer files are in model_path
    trust_remote_code: bool = False
    # How the engine receives the scored weights (weight_sync.py): load, or reload from a
    # source checkpoint (weight_sync_source below), the weights travelling in weight_sync_dtype.
    weight_sync: str = _SETTINGS.weight_sync
    weight_sync_dtype: str = _SETTINGS.weight_sync_dtype
    # Tensors the sync does not send: a planted stale parameter (tests only; never a knob).
    weight_sync_withhold: tuple[str, ...] = ()
    # The checkpoint a reload engine is built from (None: the perturbed scored checkpoint):
    # a one-step identity's pre-update state W0 (adapters/hf/update_step.py).
    weight_sync_source: str | None = None

    @classmethod
    def from_settings(cls, settings: VllmSettings, **construction: Any) -> RolloutEngineConfig:
        """The engine built for the side's settings: every setting that is a field here, by
        name (``SETTINGS_NOT_BUILT`` are none: the requests' batch size, the operator
        binding's backend, a context parallelism only ever materialized as 1), and the
        runtime's ``construction`` options."""
        return built_from(cls, settings, **construction)

    def validate(self) -> None:
        if self.dtype not in DTYPES:
            raise UnsupportedKnobError(
                "unsupported_value", f"dtype {self.dtype!r} not in {DTYPES}", ROLLOUT_DTYPE.path
            )
        if self.tensor_parallel_size < 1:
            raise UnsupportedKnobError(
                "unsupported_value",
                "tensor_parallel_size must be >= 1",
                ROLLOUT_TENSOR_PARALLEL_SIZE.path,
            )
        if self.logprobs_mode not in ENGINE_LOGPROBS_MODES:
            raise UnsupportedKnobError(
                "unsupported_value",
                f"logprobs_mode {self.logprobs_mode!r} not in {ENGINE_LOGPROBS_MODES}",
                ROLLOUT_LOGPROBS_MODE.path,
            )
        if self.executor not in ("auto", "external_launcher"):
            raise UnsupportedKnobError(
                "unsupported_value",
                f"executor {self.executor!r}",
                ROLLOUT_TENSOR_PARALLEL_SIZE.path,
            )
        if self.executor == "external_launcher" and not self.in_process:
            raise UnsupportedKnobError(
                "unsupported_value",
                "external_launcher needs the engine core in-process",
                ROLLOUT_TENSOR_PARALLEL_SIZE.path,
            )
        if self.logits_dtype not in LOGITS_DTYPE_CHOICES.values():
            raise UnsupportedKnobError(
                "unsupported_value",
                f"logits dtype {self.logits_dtype!r}",
                ROLLOUT_LOGITS_DTYPE.path,
            )
        weight_sync.validate(self.weight_sync, self.weight_sync_dtype)
        if self.kv_cache_memory_bytes <= 0:
            raise UnsupportedKnobError(
                "unsupported_value",
                "kv_cache_memory_bytes must be positive",
                ROLLOUT_KV_CACHE_MEMORY_BYTES.name,
            )


# The vLLM side's settings no engine field holds (``tests/core/test_settings.py`` checks it):
# the scoring mode is how a score call asks (``side_engine.VllmRolloutSide``), not the engine.
SETTINGS_NOT_BUILT = frozenset(
    {"batch_size", "logp_backend", "context_parallel_size", "scoring_mode"}
)


def _worker_state(worker: Any) -> dict[str, Any]:
    """Runs inside each vLLM worker (collective_rpc): what the loaded model really is."""
    import torch

    model = worker.model_runner.model
    dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters()})
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    from vllm.distributed import parallel_state

    tp_world = parallel_state.get_tensor_model_parallel_world_size()
    forward_context = worker.model_runner.vllm_config.compilation_config.static_forward_context
    kv_dtypes = sorted(
        {str(getattr(layer, "kv_cache_dtype", None)) for layer in forward_context.values()}
        - {"None"}
    )
    import vllm.envs as vllm_envs
    from vllm.model_executor.determinism import batch_invariant

    from xconf.adapters.vllm import sampling

    return {
        "vocab": _vocab_shard(model, parallel_state.get_tensor_model_parallel_rank()),
        # What this worker's attention layers were built with, and whether the batch-invariant
        # aten overrides are installed in this process.
        "kv_cache_dtypes": kv_dtypes,
        "kv_cache_tensor_dtypes": sorted(
            {str(t.dtype) for t in getattr(worker.model_runner, "kv_caches", [])}
        ),
        "batch_invariant": bool(
            vllm_envs.VLLM_BATCH_INVARIANT and batch_invariant._batch_invariant_MODE
        ),
        "rank": rank,
        "tp_world_size": tp_world,
        "param_dtypes": dtypes,
        # The dtype this worker's model was built to compute in (its model config). The set of
        # parameter dtypes is not it: some models keep a few parameters in float32.
        "compute_dtype": str(worker.model_runner.model_config.dtype).removeprefix("torch."),
        "device": str(next(model.parameters()).device),
        "model_class": type(model).__name__,
        # The dtype the logits processor projects the lm_head in (None: no logits processor).
        "head_dtype": _head_dtype(model),
        # The (logprobs mode, temperature, top-k, top-p) the sampler used on the scored
        # requests' rows since the last reset (sampling.py).
        "sampling": sampling.seen(),
    }


def _head_dtype(model: Any) -> str | None:
    head = getattr(getattr(model, "logits_processor", None), "head_dtype", None)
    return None if head is None else str(head).removeprefix("torch.")


def _vocab_shard(model: Any, tp_rank: int) -> dict[str, int] | None:
    """This worker's slice of the output vocabulary, as vLLM's lm_head laid it out.

    ``VocabParallelEmbedding`` pads the vocabulary (to a multiple of 64) and gives each TP
    rank one contiguous shard of the padded columns: recorded as built, never recomputed.
    """
    head: Any = getattr(model, "lm_head", None)
    indices = getattr(head, "shard_indices", None)
    if indices is None:
        return None
    return {
        "tp_rank": int(tp_rank),
        "real_vocab_size": int(head.org_vocab_size),
        "padded_vocab_size": int(head.num_embeddings_padded),
        "added_vocab_size": int(head.num_added_embeddings),
        "start": int(indices.padded_org_vocab_start_index),
        "end": int(indices.padded_org_vocab_end_index),
    }


def _tokenizer_cache_counts() -> tuple[int, int] | None:
    """(hits, misses) of vLLM's per-process tokenizer cache so far (None: it has none)."""
    try:
        from vllm.tokenizers.registry import cached_get_tokenizer
    except ImportError:
        return None
    info = getattr(cached_get_tokenizer, "cache_info", None)
    if not callable(info):
        return None
    stats = info()
    return int(stats.hits), int(stats.misses)


class VllmRolloutEngine:
    """One vLLM ``LLM`` built for one :class:`RolloutEngineConfig`."""

    # Runs inside every worker on readback (collective_rpc).
    worker_state = staticmethod(_worker_state)

    def __init__(self, cfg: RolloutEngineConfig) -> None:
        cfg.validate()
        self.cfg = cfg
        self._closed = True
        self.weight_sync: SyncRecord | None = None  # None: the engine loaded the checkpoint
        files, reference = (
            weight_sync.reference(cfg, VllmRolloutEngine)
            if cfg.weight_sync == WEIGHT_SYNC_RELOAD
            else (None, None)
        )
        self._sync_root = None if files is None else files.root
        # The dtype the weights came in: the checkpoint's under load (the sync's: weight_sync).
        self.checkpoint_dtype = (
            weight_sync.checkpoint_dtype(cfg.model_path) if files is None else None
        )
        try:
            self._build(cfg, cfg.model_path if files is None else str(files.source))
            if files is not None and reference is not None:
                from xconf.adapters.vllm.live_weights import parameter_digests

                self.weight_sync = weight_sync.sync(self.llm, files, reference, parameter_digests)
        except BaseException:
            self.close()
            self._remove_sync_files()
            raise

    def _build(self, cfg: RolloutEngineConfig, model_path: str) -> None:
        """The ``LLM`` of ``cfg``, its weights loaded from ``model_path``."""
        configure_env(cfg.in_process, bool(cfg.batch_invariant), cfg.tensor_parallel_size)
        try:
            from vllm import LLM
        except ImportError as exc:
            raise RuntimeUnavailableError(
                "runtime_unavailable", f"vllm cannot be imported: {exc}", "runtime.rollout"
            ) from exc
        kwargs: dict[str, Any] = dict(
            model=model_path,
            tokenizer=cfg.tokenizer_path or cfg.model_path,
            trust_remote_code=cfg.trust_remote_code,
            load_format="safetensors",  # never a pickle checkpoint, even if one sits beside
            dtype=cfg.dtype,
            enable_prefix_caching=cfg.enable_prefix_caching,
            enforce_eager=cfg.enforce_eager,
            tensor_parallel_size=cfg.tensor_parallel_size,
            kv_cache_memory_bytes=cfg.kv_cache_memory_bytes,
            seed=cfg.seed,
            max_model_len=cfg.max_model_len,
            max_num_seqs=cfg.max_num_seqs,
            logprobs_mode=cfg.logprobs_mode,
            logits_processors=[FORCED_TOKENS_PROCESSOR],
        )
        kwargs["kv_cache_dtype"] = cfg.kv_cache_dtype
        if cfg.logits_dtype == LOGITS_FLOAT32:
            # vLLM's LogitsProcessor then casts the hidden states and lm_head to float32
            kwargs["hf_overrides"] = {"head_dtype": LOGITS_FLOAT32}
        if cfg.enable_chunked_prefill is not None:
            kwargs["enable_chunked_prefill"] = cfg.enable_chunked_prefill
        if cfg.max_num_batched_tokens is not None:
            kwargs["max_num_batched_tokens"] = cfg.max_num_batched_tokens
        if cfg.logprobs_mode == "raw_logits":
            # Full-vocabulary logprobs stay servable as vLLM's dicts: the scorer takes the
            # rows as tensors instead (rows.py), and the tests compare the two bit for bit.
            kwargs["max_logprobs"] = -1
        if cfg.executor == "external_launcher":
            kwargs["distributed_executor_backend"] = "external_launcher"
        elif cfg.tensor_parallel_size > 1:
            kwargs["distributed_executor_backend"] = "mp"
        for other in list(_LIVE):
            other.close()
        import torch.distributed as dist

        # An in-process engine core tears torch.distributed down on shutdown; when a launcher
        # owns the process group, this engine must leave it alone (see close()).
        self._owns_process_group = not (dist.is_available() and dist.is_initialized())
        from xconf.adapters.models.facts import load_failure
        from xconf.errors import XconfError

        REAPER.make_room(
            engine_memory_estimate(model_path, cfg.kv_cache_memory_bytes, cfg.tensor_parallel_size)
        )
        heap.hold()
        try:
            tokenizer_cache_before = _tokenizer_cache_counts()
            with heap.vllm_gc_calls_skipped():
                self.llm: Any = LLM(**kwargs)
            # vLLM keeps the tokenizers it loaded per process (keyed by files and options):
            # recorded, so that a reuse is never invisible.
            after = _tokenizer_cache_counts()
            # Reused: served from the cache without loading (an engine may ask twice).
            self.tokenizer_reused = (
                None
                if after is None or tokenizer_cache_before is None
                else after[1] == tokenizer_cache_before[1] and after[0] > tokenizer_cache_before[0]
            )
        except BaseException as exc:
            if cfg.in_process and self._owns_process_group:
                # A build that failed half-way may have started torch.distributed: left up,
                # the next engine in this process would take it for a launcher's group.
                destroy_vllm_distributed()
            heap.released()
            if isinstance(exc, XconfError) or not isinstance(exc, Exception):
                raise  # a case deadline (already coded), an interrupt
            # pydantic, ValueError, AssertionError, RuntimeError...
            raise load_failure("vLLM", exc, model_path) from exc
        self._closed = False
        _LIVE.add(self)
        # Prompt rows are kept as tensors in every worker for the requests that ask (rows.py):
        # the operator path's, and the full-vocabulary figures' on the native path.
        from xconf.adapters.vllm.rows import install_prompt_capture

        self.llm.collective_rpc(install_prompt_capture)
        # The sampler records what it used on the scored rows, and (processed logprobs)
        # forces the frozen tokens after it computed them (sampling.py).
        from xconf.adapters.vllm.sampling import install_sampler_hook

        self.llm.collective_rpc(install_sampler_hook)
        self.last_batch_size: int | None = None  # the chunking of the last score call
        self.last_scoring_mode: str | None = None  # decode or prefill, of the last score call
        self.request_sizes: list[int] = []  # requests the engine answered per generate call
        # Prompt tokens the scored pass took from the prefix cache (None: not scored yet).
        self.prefix_cache_hits: int | None = None

    @property
    def closed(self) -> bool:
        return self._closed

    def note_request(self, n_outputs: int, cached_tokens: int = 0) -> None:
        """Record how many requests the engine answered in one generate call, and how many
        prompt tokens it served from the prefix cache (``RequestOutput.num_cached_tokens``)."""
        self.request_sizes.append(n_outputs)
        self.prefix_cache_hits = (self.prefix_cache_hits or 0) + cached_tokens

    def reset_state(self) -> None:
        """Forget every cached KV block, so a case never depends on the cases before it."""
        self.llm.reset_prefix_cache()
        from xconf.adapters.vllm.sampling import forget

        self.llm.collective_rpc(forget)
        self.request_sizes = []
        self.prefix_cache_hits = None

    @property
    def tokenizer(self) -> Any:
        return self.llm.get_tokenizer()

    def live(self) -> VllmState:
        """The engine's live, resolved configuration, what its scored pass was served, and
        each worker's loaded model (the rollout handlers read each knob from it)."""
        if self._closed:
            raise ScoringError("engine_closed", "readback on a closed engine", "runtime.rollout")
        config = self.llm.llm_engine.vllm_config
        served = (self.prefix_cache_hits, tuple(self.request_sizes), self.last_batch_size)
        reused, mode = self.tokenizer_reused, self.last_scoring_mode
        try:
            workers = self.llm.collective_rpc(self.worker_state)
        except Exception as exc:  # readback must not kill scoring; record why
            failed = f"{type(exc).__name__}: {exc}"
            return VllmState(config, *served, None, failed, reused, mode, *self._synced)
        return VllmState(config, *served, tuple(workers), None, reused, mode, *self._synced)

    @property
    def _synced(self) -> tuple[SyncRecord | None, str | None]:
        return self.weight_sync, self.checkpoint_dtype

    def _remove_sync_files(self) -> None:
        if self._sync_root is not None:
            import shutil

            shutil.rmtree(self._sync_root, ignore_errors=True)
            self._sync_root = None

    def close(self) -> None:
        """Shut the engine down and release the distributed state it created."""
        if self._closed:
            self._remove_sync_files()
            return
        self._closed = True
        _LIVE.discard(self)
        llm = self.llm
        del self.llm
        if self.cfg.in_process and not self._owns_process_group:
            # Leave the launcher's process group intact: no EngineCore.shutdown().
            finalizer = getattr(llm.llm_engine.engine_core, "_finalizer", None)
            if finalizer is not None:
                finalizer.detach()
            del llm
            heap.released()
            return
        # The workers of a multiprocess engine exit in the background (reaper.py says when
        # the next build waits for them).
        REAPER.defer(inprocess_executor(llm))
        with contextlib.suppress(Exception), heap.vllm_gc_calls_skipped():
            llm.llm_engine.engine_core.shutdown()  # a dead engine core must not block cleanup
        del llm
        if self.cfg.in_process:
            destroy_vllm_distributed()
        heap.released()
        self._remove_sync_files()

    def __enter__(self) -> VllmRolloutEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
