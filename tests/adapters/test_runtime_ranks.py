"""S2 under a 2-rank world (what the torchrun launcher gives a case): vLLM TP=2 through the
external launcher on the same ranks as an FSDP2 training scorer; rank 0 publishes."""

from __future__ import annotations

import datetime
import json
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.adapters.conftest import needs_vllm
from tests.adapters.spawned_ranks import free_port, run_ranks

pytestmark = [needs_vllm, pytest.mark.slow]
WORLD = 2
TIMEOUT_S = 420


def _rank_main(rank: int, port: int, model_cache: str, out_dir: str) -> None:
    import torch.distributed as dist

    from tests.adapters.test_runtime_s2 import _spec
    from xconf.adapters.checkpoint.runtime import CheckpointRuntime
    from xconf.experiment import Intervention
    from xconf.runtime.ranks import close_world
    from xconf.session import prepare, run_prepared

    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(WORLD),
        XCONF_MODEL_CACHE=model_cache,
    )
    dist.init_process_group(
        "gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=300)
    )
    try:
        spec = _spec(["rollout.tensor_parallel_size=2", "training.sharding=fsdp"])
        spec = replace(
            spec, interventions=(Intervention("training.attention_backend", ("eager",)),)
        )
        prepared = prepare(spec, output_root=out_dir, allow_smoke_operators=False, device="cpu")
        runtime = CheckpointRuntime("vllm", "hf", model_cache=model_cache)
        summary = run_prepared(prepared, runtime, resume=False)
        rows = [
            {
                "label": r.label,
                "result": r.result,
                "max": r.max_abs_diff,
                "case": r.case_id,
                "attempt": r.attempt_id,
                "reason": r.reason,
            }
            for r in summary.records
        ]
        Path(out_dir, f"rank{rank}.json").write_text(
            json.dumps({"rows": rows, "dir": summary.experiment_dir})
        )
    finally:
        close_world()


def test_tp2_rollout_and_fsdp_training_on_two_ranks(
    model_record: Any, model_cache: str, tmp_path: Path
) -> None:
    started = time.perf_counter()
    run_ranks(_rank_main, (free_port(), model_cache, str(tmp_path)), WORLD, TIMEOUT_S)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    assert ranks[0]["rows"] == ranks[1]["rows"]  # every rank reports rank 0's records
    rows = {r["label"]: r for r in ranks[0]["rows"]}
    assert rows["baseline"]["result"] == "pass", rows["baseline"]
    assert rows["training.attention_backend=eager"]["result"] == "pass"
    base = rows["baseline"]
    actual = json.loads(
        (
            Path(ranks[0]["dir"]) / "cases" / base["case"] / base["attempt"] / "actual.json"
        ).read_text()
    )
    knobs = {(k["side"], k["path"]): k for side in actual["sides"].values() for k in side}
    assert knobs[("rollout", "rollout.tensor_parallel_size")]["actual"] == 2
    assert knobs[("training", "training.sharding")]["actual"] == "fsdp"
    assert all(k["status"] == "applied" for k in knobs.values()), knobs
    print(f"2-rank S2 (TP=2 external launcher + FSDP2): {time.perf_counter() - started:.1f} s")
