"""Rank worker of tests/megatron/test_tensor_parallel.py, in a module of its own (spawned
ranks import only this): a world of three gloo ranks, the Megatron side on ranks 0-1."""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path
from typing import Any

WORLD = 3
TP = 2
# name -> (checkpoint, settings): TP 2 as Megatron builds it by default, and with sequence
# parallelism, SDPA attention, packed rows and the fused cross entropy all at once.
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "plain": ("llama-gqa", {}),
    "sequence_parallel": (
        "qwen3-gqa",
        {
            "sequence_parallel": True,
            "attention_backend": "sdpa",
            "remove_padding": True,
            "cross_entropy_loss_fusion": True,
        },
    ),
}
READINGS = (
    "training.tensor_parallel_size",
    "training.sequence_parallel",
    "training.remove_padding",
    "training.attention_backend",
    "training.cross_entropy_loss_fusion",
    "training.world_size",
    "training.launcher_world_size",
)


def vocab_parallel_operator() -> Any:
    from xconf.operators.dispatch import DispatchedOperator
    from xconf.ops.logprob.descriptors import descriptors
    from xconf.ops.logprob.selected import VocabParallelSelectedLogprob

    return DispatchedOperator(
        VocabParallelSelectedLogprob(impl="eager"), descriptors()[0], "training"
    )


def rank_main(rank: int, port: int, roots: dict[str, str], out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    from xconf.runtime.ranks import close_world

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=240)
    )
    try:
        result = _on_rank(rank, roots, Path(out_dir))  # engines released when it returns
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
        dist.barrier()
    finally:
        close_world()


def _on_rank(rank: int, roots: dict[str, str], out: Path) -> dict[str, Any]:
    from safetensors.torch import save_file

    from tests.megatron.inputs import score
    from xconf.adapters.megatron import side
    from xconf.adapters.megatron.settings import MegatronSettings

    result: dict[str, Any] = {}
    tensors = {}
    for name, (ckpt, settings) in CASES.items():
        # On ranks 0-1; rank 2 receives rank 0's score and readback.
        engine: Any = side.engine_for(
            MegatronSettings(tensor_parallel_size=TP, **settings), model_path=roots[ckpt]
        )
        tensors[f"{name}.native"] = score(engine)
        back = dict(engine.readback())
        result[name] = {
            "built": engine.engine is not None,
            "readback": {k: back.get(k) for k in READINGS},
            "vocab_bounds": [list(b) for b in back["training.vocab_layout"].shard_bounds],
        }
        if name == "plain":
            op = vocab_parallel_operator()
            tensors["plain.vocab_parallel"] = score(engine, op)  # on Megatron's shards
            # The same implementation as a plain function: called on gathered full rows.
            tensors["plain.full_rows"] = score(engine, op.implementation)
            result["violation"] = _one_rank_writes(rank, engine.engine)
        engine.close()
    if rank == 0:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "scores.safetensors"))
    return result


def _one_rank_writes(rank: int, member: Any) -> str | None:
    """Rank 1 alone writes into its shard while scoring: both TP ranks must raise (neither
    may return a score, or wait in a collective the other left). Off the side: nothing."""
    from tests.megatron.inputs import score
    from xconf.adapters.errors import ReadOnlyViolationError

    if member is None:
        return None
    param = next(member.model.parameters())

    def write(*_: Any) -> None:
        if rank == 1:
            param.data.add_(1.0)

    hook = member.model.decoder.register_forward_hook(write)
    try:
        score(member)
    except ReadOnlyViolationError as exc:
        return exc.code
    finally:
        hook.remove()
    return "no error"
