"""Multi-process helpers for the vocab-parallel tests: real gloo worlds via spawn."""

from __future__ import annotations

import datetime
import json
import os
import socket
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from xconf.ops.logprob.contract import (
    LogprobContract,
    ReductionSpec,
    ShardingSpec,
    even_shard_bounds,
)
from xconf.ops.logprob.errors import LogprobPreflightError, LogprobValidationError
from xconf.ops.logprob.vocab_parallel import vocab_parallel_selected_logprob

ROWS = 13
NUM_TILES = 8
# (name, real vocab, padded vocab, bounds by TP size); every bound is a multiple of the
# tile width (padded / NUM_TILES): 32 columns, or 39 to cross the kernels' vector widths.
VOCABS: tuple[tuple[str, int, int, dict[int, tuple[tuple[int, int], ...]]], ...] = (
    ("even_unpadded", 256, 256, {w: even_shard_bounds(256, w) for w in (1, 2, 4)}),
    (
        "uneven_padded",
        250,
        256,
        {
            1: ((0, 256),),
            2: ((0, 96), (96, 256)),
            4: ((0, 32), (32, 128), (128, 160), (160, 256)),
        },
    ),
    (
        "odd_tile_padded",
        300,
        312,
        {
            1: ((0, 312),),
            2: ((0, 117), (117, 312)),
            4: ((0, 78), (78, 156), (156, 234), (234, 312)),
        },
    ),
)
DTYPES = (torch.float32, torch.bfloat16)
IMPLS = ("native", "compiled", "eager")  # each keeps its own bits across TP sizes


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _entry(
    rank: int, world: int, port: int, out: str, fn: Callable[..., Any], args: tuple[Any, ...]
) -> None:
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group(
        "gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60)
    )
    try:
        _save_result(fn(rank, world, *args), Path(out), rank)
    except BaseException:
        (Path(out) / f"rank{rank}.err").write_text(traceback.format_exc())
        raise
    finally:
        dist.destroy_process_group()


def run_world(
    world: int, fn: Callable[..., Any], out: Path, *args: Any, deadline_s: float = 900.0
) -> list[Any]:
    """Run ``fn(rank, world, *args)`` on ``world`` spawned gloo ranks; return their results.

    Nothing may hang: past ``deadline_s`` the ranks are terminated and the call fails.
    """
    out.mkdir(parents=True, exist_ok=True)
    ctx = mp.spawn(_entry, args=(world, free_port(), str(out), fn, args), nprocs=world, join=False)
    stop = time.monotonic() + deadline_s
    while not ctx.join(timeout=1.0):
        if time.monotonic() > stop:
            for process in ctx.processes:
                if process.is_alive():
                    process.terminate()
            raise TimeoutError(f"gloo world of {world} did not finish in {deadline_s} s")
    return [_load_result(out, r) for r in range(world)]


# A rank's result goes back without pickle: its tensors in safetensors, the rest (dicts,
# lists, tuples as lists, numbers, strings) in JSON naming each tensor by its key.
def _save_result(result: Any, out: Path, rank: int) -> None:
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}

    def encode(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            key = f"t{len(tensors)}"
            tensors[key] = value.detach().contiguous().clone()
            return {"__tensor__": key}
        if isinstance(value, dict):
            return {str(k): encode(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [encode(v) for v in value]
        return value

    document = encode(result)
    save_file(tensors, str(out / f"rank{rank}.safetensors"))
    (out / f"rank{rank}.json").write_text(json.dumps(document))


def _load_result(out: Path, rank: int) -> Any:
    from safetensors.torch import load_file

    tensors = load_file(str(out / f"rank{rank}.safetensors"))

    def decode(value: Any) -> Any:
        if isinstance(value, dict):
            if set(value) == {"__tensor__"}:
                return tensors[value["__tensor__"]]
            return {k: decode(v) for k, v in value.items()}
        if isinstance(value, list):
            return [decode(v) for v in value]
        return value

    return decode(json.loads((out / f"rank{rank}.json").read_text()))


def inputs(real: int, padded: int, dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Full logits, targets (some inactive rows hold junk), active mask, upstream weights."""
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(ROWS, padded, generator=gen) * 3).to(dtype)
    logits[:, real:] = 1e4  # junk in the padding: must be masked, never read
    logits[2, 5] = float("-inf")
    target = torch.randint(0, real, (ROWS,), generator=gen)
    active = torch.ones(ROWS, dtype=torch.bool)
    active[[3, 7]] = False
    target[7] = padded + 99  # an inactive row may hold any id
    weights = torch.randn(2, ROWS, generator=gen)
    return logits, target, active, weights


def contract_for(
    real: int,
    padded: int,
    bounds: Any,
    dtype: torch.dtype,
    rank: int,
    scope: str = "cross_tp_bitwise",
) -> Any:
    return LogprobContract(
        sharding=ShardingSpec(real, padded, bounds, tp_rank=rank),
        logits_dtype=str(dtype).removeprefix("torch."),  # type: ignore[arg-type]
        reduction=ReductionSpec(determinism_scope=scope),  # type: ignore[arg-type]
    )


def _score_with_grad(
    local_logits: torch.Tensor,
    target: torch.Tensor,
    active: torch.Tensor,
    weights: torch.Tensor,
    contract: Any,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Forward outputs and the gradient of a weighted loss on both, for one local shard."""
    local = local_logits.clone().requires_grad_()
    logprob, lse = vocab_parallel_selected_logprob(
        local, target, active, contract=contract, num_vocab_tiles=NUM_TILES, **kwargs
    )
    loss = (logprob * weights[0]).sum() + (torch.where(active, lse, 0) * weights[1]).sum()
    loss.backward()
    assert local.grad is not None
    return logprob.detach(), lse.detach(), local.grad.detach()


def score_all(rank: int, world: int, impl: str = "compiled") -> dict[str, Any]:
    """Every (vocab, dtype) case, twice: forward outputs and the local gradient shard."""
    results: dict[str, Any] = {}
    for name, real, padded, bounds_by_world in VOCABS:
        bounds = bounds_by_world[world]
        lo, hi = bounds[rank]
        for dtype in DTYPES:
            logits, target, active, weights = inputs(real, padded, dtype)
            contract = contract_for(real, padded, bounds, dtype, rank)
            for attempt in range(2):
                results[f"{name}/{dtype!s}/{attempt}"] = _score_with_grad(
                    logits[:, lo:hi], target, active, weights, contract, impl=impl
                )
    return results


def score_impls(rank: int, world: int, impls: tuple[str, ...]) -> dict[str, Any]:
    return {impl: score_all(rank, world, impl) for impl in impls}


def score_by_all_gather(rank: int, world: int, impls: tuple[str, ...]) -> dict[str, Any]:
    """``score_impls`` with the exchange other backends (NCCL) take: one all_gather_single
    instead of gloo's all_to_all, so that branch is checked bit for bit on this machine."""
    from xconf.ops.logprob import vocab_parallel

    vocab_parallel._gathers_by_all_to_all = lambda group: False  # type: ignore[assignment]
    return score_impls(rank, world, impls)


def tp2_world(rank: int, world: int) -> dict[str, Any]:
    """Bitwise scoring (every impl) plus every preflight failure, in one world of two."""
    results: dict[str, Any] = score_impls(rank, world, IMPLS)
    real, padded = 256, 256
    bounds = even_shard_bounds(padded, world)
    logits, target, active, _ = inputs(real, padded, torch.float32)
    lo, hi = bounds[rank]
    local = logits[:, lo:hi].contiguous()
    errors: dict[str, str] = {}
    seconds: dict[str, float] = {}
    scoped: dict[str, tuple[LogprobContract, dict[str, Any]]] = {
        "tiles": (
            contract_for(real, padded, bounds, torch.float32, rank),
            {"num_vocab_tiles": 8 if rank == 0 else 4},
        ),
        "determinism": (
            LogprobContract(
                sharding=ShardingSpec(real, padded, bounds, tp_rank=rank),
                reduction=ReductionSpec(
                    determinism_scope="cross_tp_bitwise" if rank == 0 else "fixed_topology"
                ),
            ),
            {"num_vocab_tiles": NUM_TILES},
        ),
        "shard_size": (
            contract_for(real, padded, bounds, torch.float32, rank),
            {"local_logits": local[:, :-1] if rank == 1 else local},
        ),
        # Agreed inputs that fail a data check, raised after the asynchronous preflight
        # was started: every rank raises the same coded error and the group stays usable.
        "bad_target": (
            contract_for(real, padded, bounds, torch.float32, rank),
            {"target_ids": torch.full_like(target, padded + 5), "validate": True},
        ),
    }
    for case, (contract, overrides) in scoped.items():
        kwargs: dict[str, Any] = {"local_logits": local, **overrides}
        started = time.perf_counter()
        try:
            vocab_parallel_selected_logprob(
                kwargs.pop("local_logits"),
                kwargs.pop("target_ids", target),
                active,
                contract=contract,
                validate=kwargs.pop("validate", False),
                **kwargs,
            )
            errors[case] = "no error"
        except (LogprobPreflightError, LogprobValidationError) as exc:
            errors[case] = exc.code
        seconds[case] = time.perf_counter() - started
        # The group is still in step: a well-formed call right after succeeds.
        vocab_parallel_selected_logprob(
            local,
            target,
            active,
            contract=contract_for(real, padded, bounds, torch.float32, rank),
            num_vocab_tiles=NUM_TILES,
            impl="eager",
        )
    results["errors"] = errors
    results["seconds"] = seconds
    return results
