"""This process's vLLM state around one engine: the environment vLLM reads when an engine
starts, the distributed groups an in-process engine leaves behind, its executor."""

from __future__ import annotations

import os
from typing import Any


def configure_env(in_process: bool, batch_invariant: bool, tensor_parallel_size: int) -> None:
    """What vLLM reads from the environment when an engine starts, set for this engine."""
    try:  # vLLM caches its environment once an engine core starts; this engine needs fresh reads
        import vllm.envs as vllm_envs

        vllm_envs.disable_envs_cache()
    except (ImportError, AttributeError, AssertionError):
        pass
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if in_process else "1"
    # Read by the worker at start-up (init_batch_invariance); set either way so that a
    # previous engine's value never leaks into this one.
    os.environ["VLLM_BATCH_INVARIANT"] = "1" if batch_invariant else "0"
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc readback
    _bind_cpu_workers(tensor_parallel_size)


_BIND = "VLLM_CPU_OMP_THREADS_BIND"
_own_bind: list[str] = []  # the binding xconf itself set for the previous engine, if any


def _bind_cpu_workers(tensor_parallel_size: int) -> None:
    """One core per CPU TP worker, round-robin, unless the user bound them.

    A binding xconf set for an earlier engine is not the user's: it is replaced (a TP=3 engine
    after a TP=2 one needs three entries) or removed (TP=1).
    """
    current = os.environ.get(_BIND, "auto")
    if _own_bind and current == _own_bind[0]:
        current = "auto"
        os.environ.pop(_BIND)
        _own_bind.clear()
    if tensor_parallel_size <= 1 or current != "auto":
        return
    try:
        from vllm.platforms import current_platform

        is_cpu = current_platform.is_cpu()
    except ImportError:  # pragma: no cover
        is_cpu = True
    if is_cpu:
        ncpu = os.cpu_count() or 1
        os.environ[_BIND] = "|".join(str(r % ncpu) for r in range(tensor_parallel_size))
        _own_bind.append(os.environ[_BIND])


def destroy_vllm_distributed() -> None:
    """End the model-parallel groups and the process group an in-process engine started."""
    try:
        from vllm.distributed.parallel_state import (
            destroy_distributed_environment,
            destroy_model_parallel,
        )

        destroy_model_parallel()
        destroy_distributed_environment()
    except Exception:
        pass


def inprocess_executor(llm: Any) -> Any:
    """The executor of an engine whose core runs in this process (None otherwise)."""
    core = getattr(getattr(llm.llm_engine, "engine_core", None), "engine_core", None)
    return getattr(core, "model_executor", None)
