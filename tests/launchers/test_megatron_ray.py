"""The Ray launcher gives the Megatron training side its tensor-parallel ranks, as torchrun
does (``test_megatron_torchrun``): the same TP 2 case on a Qwen3 checkpoint made with
transformers' own classes, each rank a Ray actor of the local two-node cluster (the session
fixture starts it, or CI's ``scripts/ci-services-up``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.adapters.conftest import needs_vllm
from tests.launchers.test_megatron_torchrun import run_megatron_tp2
from tests.launchers.test_ray_runs import no_rank_actor_left, on_ray
from tests.megatron.conftest import needs_megatron

pytestmark = [needs_vllm, needs_megatron, pytest.mark.slow]


def test_ray_gives_megatron_two_tp_ranks(ray_cluster: str, tmp_path: Path) -> None:
    run_megatron_tp2(tmp_path, on_ray(ray_cluster))
    assert no_rank_actor_left() == []  # no rank actor outlives its case
