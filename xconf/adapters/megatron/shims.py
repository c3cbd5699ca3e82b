"""Megatron-core's CUDA-only and launcher-only calls, made to run on CPU: the one place.

megatron-core assumes a GPU and a ``parallel_state`` that ``initialize_model_parallel`` set up.
The side builds its ``GPTModel`` with explicit process groups instead (a launched side group, or
one private rank), and these shims cover what remains. Each is a scoped context or a one-time
setup, applied only where the call would otherwise fail, and each has its own test
(``tests/adapters/megatron/test_shims.py``):

* :func:`cpu_current_device`: two places call ``torch.cuda.current_device()`` whatever the
  config says: ``RotaryEmbedding.get_emb`` moves ``inv_freq`` to it at the first forward, and
  ``GlobalMemoryBuffer.get_tensor`` allocates the attention matmul buffer on it. While a
  CPU model builds or runs, the current device is the CPU.
* :func:`inference_rng_tracker`: ``model_parallel_cuda_manual_seed`` seeds CUDA generators.
  Scoring is eval mode with zero dropout, so it draws no random number: Megatron's inference
  tracker (whose ``fork`` is a no-op) replaces the CUDA states.
* :func:`memory_buffer`: the global memory buffer ``initialize_model_parallel`` would create,
  created once (the attention matmul buffer comes from it).
* :func:`torch_distributed`: Megatron's layers need ``torch.distributed`` initialised even at
  TP 1 (they ask ``get_tensor_model_parallel_group_if_none``, which answers None otherwise).
  Outside a launched world a build or forward runs inside a one-rank gloo world on a private
  in-memory store, destroyed again when it returns, so nothing outside sees a world.
* :func:`tensor_parallel_state`: Megatron's unfused ``vocab_parallel_cross_entropy`` reads its
  group from ``parallel_state``'s globals; for the call, they name the model's own group.
"""

from __future__ import annotations

import contextlib
import datetime
import threading
import warnings
from collections.abc import Iterator
from typing import Any

_LOCK = threading.RLock()


class _CpuDevice:
    """How many blocks run with the CPU as the current device, and the function they hid."""

    depth = 0
    hidden: Any = None


def import_megatron() -> Any:
    """``megatron.core``, imported with its import-time notices silenced (it warns that
    Transformer Engine and Apex are absent: the local spec needs neither)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import megatron.core
        import megatron.core.models.gpt.gpt_layer_specs
        import megatron.core.models.gpt.gpt_model
    return megatron.core


@contextlib.contextmanager
def cpu_current_device() -> Iterator[None]:
    """``torch.cuda.current_device()`` is the CPU while the block runs (re-entrant)."""
    import torch

    with _LOCK:
        if _CpuDevice.depth == 0:
            _CpuDevice.hidden = torch.cuda.current_device
            torch.cuda.current_device = _cpu  # type: ignore[assignment]
        _CpuDevice.depth += 1
    try:
        yield
    finally:
        with _LOCK:
            _CpuDevice.depth -= 1
            if _CpuDevice.depth == 0:
                torch.cuda.current_device = _CpuDevice.hidden
                _CpuDevice.hidden = None


def _cpu() -> Any:
    import torch

    return torch.device("cpu")


def inference_rng_tracker() -> None:
    """Megatron's RNG tracker is its inference tracker (no CUDA generator is ever seeded)."""
    from megatron.core.tensor_parallel import random

    tracker = random.get_cuda_rng_tracker(inference_rng_tracker=True)
    if not getattr(tracker, "is_inference_rng_tracker", False):  # another tracker was set up
        random.initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)


def memory_buffer() -> None:
    """Megatron's global memory buffer, created once (``initialize_model_parallel`` would)."""
    from megatron.core import parallel_state

    with _LOCK:
        if parallel_state._GLOBAL_MEMORY_BUFFER is None:
            parallel_state._set_global_memory_buffer()


def one_rank_group(timeout_s: float = 60.0) -> Any:
    """A one-rank gloo process group on a private in-memory store: the tensor-parallel (and
    every other) group of a TP 1 model, whoever owns the default world."""
    import torch.distributed as dist

    return dist.ProcessGroupGloo(dist.HashStore(), 0, 1, datetime.timedelta(seconds=timeout_s))


@contextlib.contextmanager
def torch_distributed() -> Iterator[None]:
    """An initialised ``torch.distributed`` for the block: the launched world where there is
    one, else a one-rank gloo world on a private store, destroyed on the way out (re-entrant:
    the outermost block that made the world destroys it)."""
    import torch.distributed as dist

    with _LOCK:
        owned = not dist.is_initialized()
        if owned:
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        if owned:
            with _LOCK:
                dist.destroy_process_group()


@contextlib.contextmanager
def tensor_parallel_state(group: Any) -> Iterator[None]:
    """``parallel_state``'s tensor-parallel group, rank and size are ``group``'s for the block
    (and what they were before, after it)."""
    from megatron.core import parallel_state as ps

    names = (
        "_TENSOR_MODEL_PARALLEL_GROUP",
        "_MPU_TENSOR_MODEL_PARALLEL_WORLD_SIZE",
        "_MPU_TENSOR_MODEL_PARALLEL_RANK",
    )
    with _LOCK:
        saved = {name: getattr(ps, name) for name in names}
        ps._TENSOR_MODEL_PARALLEL_GROUP = group
        ps._MPU_TENSOR_MODEL_PARALLEL_WORLD_SIZE = group.size()
        ps._MPU_TENSOR_MODEL_PARALLEL_RANK = group.rank()
        try:
            yield
        finally:
            for name, value in saved.items():
                setattr(ps, name, value)


@contextlib.contextmanager
def megatron_on(device: str) -> Iterator[None]:
    """Everything a build or forward of a Megatron model on ``device`` needs around it."""
    import_megatron()
    inference_rng_tracker()
    memory_buffer()
    with torch_distributed(), warnings.catch_warnings():
        # Megatron's own deprecation notices (an MLP without ffn_hidden_size, the default CUDA
        # graph scope), about its defaults, not about what xconf sets.
        warnings.filterwarnings("ignore", category=DeprecationWarning, module="megatron")
        warnings.filterwarnings("ignore", message="full scope is deprecated", module="megatron")
        if device == "cpu":
            with cpu_current_device():
                yield
        else:
            yield
