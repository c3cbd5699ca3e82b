"""The torchrun launcher gives the Megatron training side its tensor-parallel ranks:
``xconf-run -m ... runtime=vllm_megatron training.tensor_parallel_size=2
hydra/launcher=torchrun`` on a Qwen3 checkpoint made with transformers' own classes (4 heads
over 2 KV heads: it splits over two ranks without replicating a KV head; Qwen3's head size
is its own, one vLLM's CPU attention takes). The launcher
derives a 2-rank world from the case's training knobs (``knobs.side_worlds``); Megatron's
parallel layers read back TP 2 over that world, its vocabulary in two shards, and the
float32 verdict is the one TP 1 gives on one process (``tests/megatron/test_tensor_parallel``
checks the scores themselves rank by rank)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.adapters.archs import write_checkpoint
from tests.adapters.conftest import needs_vllm
from tests.launchers.test_s0_multirun import xconf_run
from tests.megatron.conftest import GQA, needs_megatron

pytestmark = [needs_vllm, needs_megatron, pytest.mark.slow]
S2 = [
    "+experiment=s2_cpu",
    "runtime=vllm_megatron",
    "identity.recipe.system_prompt=''",
    "identity.recipe.response_len=6",
    "interventions=[]",
    "+training.tensor_parallel_size=2",
]


def test_torchrun_gives_megatron_two_tp_ranks(tmp_path: Path) -> None:
    run_megatron_tp2(tmp_path, ["hydra/launcher=torchrun"])


def run_megatron_tp2(tmp_path: Path, launcher: list[str], *, launch_record: bool = True) -> None:
    """The TP 2 case under ``launcher``: a 2-rank world, Megatron's parallel layers over it
    (read back), the vocabulary in two shards, a float32 pass. ``launch_record``: the
    launcher writes ``launch.json`` (torchrun, Ray; Slurm's jobs are submitit's)."""
    ckpt = write_checkpoint("qwen3", tmp_path / "qwen3-gqa", config=GQA)
    out, sweep = tmp_path / "out", tmp_path / "mr"
    done = xconf_run(
        tmp_path,
        *S2,
        *launcher,
        f"runtime.model.path={ckpt}",
        f"output_root={out}",
        f"hydra.sweep.dir={sweep}",
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    if launch_record:
        (launch,) = sweep.glob("*/launch.json")
        record = json.loads(launch.read_text())
        assert (record["world_size"], record["status"]) == (2, "completed"), record
    (attempt,) = (out / "s2-cpu").glob("cases/*/*")
    actual = json.loads((attempt / "actual.json").read_text())
    (knob,) = [
        k for k in actual["sides"]["training"] if k["path"] == "training.tensor_parallel_size"
    ]
    assert (knob["status"], knob["actual"]) == ("applied", 2), knob
    read = actual["readback"]["training"]
    assert (read["training.world_size"], read["training.launcher_world_size"]) == (2, 2), read
    layout = actual["derived"]["training"]["training.vocab_layout"]
    assert layout["tp_world_size"] == 2 and len(layout["shard_bounds"]) == 2, layout
    assert json.loads((attempt / "comparison.json").read_text())["result"] == "pass"
