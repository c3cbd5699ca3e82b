"""The submitit Slurm launcher gives the Megatron training side its tensor-parallel ranks, as
torchrun (``test_megatron_torchrun``) and Ray (``test_megatron_ray``) do: the same TP 2 case
on a Qwen3 checkpoint made with transformers' own classes, as one Slurm job of two tasks on
the local cluster (the session fixture starts it, or CI's ``scripts/ci-services-up``). Rank 0
picks the rendezvous port and publishes it to the other task (``slurm_rank``), so a port
another process holds never stops the world from forming."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.adapters.conftest import needs_vllm
from tests.launchers.test_megatron_torchrun import run_megatron_tp2
from tests.megatron.conftest import needs_megatron

pytestmark = [needs_vllm, needs_megatron, pytest.mark.slow]


def test_slurm_gives_megatron_two_tp_ranks(slurm_cluster: Path, tmp_path: Path) -> None:
    launcher = ["hydra/launcher=xconf_submitit_slurm", "hydra.launcher.timeout_min=10"]
    run_megatron_tp2(tmp_path, launcher, launch_record=False)
