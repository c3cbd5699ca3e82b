"""Readback from the live engines: the vocab layout as built, and failed reads as ``error``.

A real vLLM engine (a subclass whose workers stop answering once ``broken`` is set: the
worker function raises inside the worker, through vLLM's own collective_rpc) and the real
transformers scorer.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.adapters.conftest import needs_hf, needs_vllm
from xconf.adapters.vllm.engine import VllmRolloutEngine
from xconf.runtime.materialization import apply_readback, split_readback
from xconf.runtime.protocol import ReadbackFailure, SideBinding, planned_application

pytestmark = [pytest.mark.slow]
# The tiny checkpoint's 512-token vocabulary: already a multiple of vLLM's padding (64).
UNPADDED_512 = {
    "real_vocab_size": 512,
    "padded_vocab_size": 512,
    "shard_bounds": [[0, 512]],
    "tp_world_size": 1,
    "cp_world_size": 1,
}


def _workers_fail(worker: Any) -> dict[str, Any]:
    raise RuntimeError("worker state is gone")


class _WorkersBreak(VllmRolloutEngine):
    broken = False

    @property
    def worker_state(self) -> Any:  # type: ignore[override]
        return _workers_fail if self.broken else VllmRolloutEngine.worker_state


def _rollout_binding() -> SideBinding:
    knobs = (
        planned_application("rollout.dtype", "rollout", "float32", "float32", "applied", "x"),
        planned_application("rollout.tensor_parallel_size", "rollout", 1, 1, "applied", "x"),
        planned_application("rollout.enforce_eager", "rollout", True, True, "applied", "x"),
    )
    return SideBinding("rollout", knobs, "float32", ())


@needs_vllm
def test_vllm_layout_is_recorded_and_a_failed_worker_read_is_an_error(model_record) -> None:
    from xconf.adapters.vllm.engine import RolloutEngineConfig
    from xconf.adapters.vllm.side import VLLM
    from xconf.adapters.vllm.side_engine import VllmRolloutSide

    cfg = RolloutEngineConfig(model_path=model_record.path)
    side = VllmRolloutSide(cfg, VLLM.readback, _WorkersBreak)
    try:
        derived, _ = split_readback(side.readback())
        # vLLM's lm_head pads the 512-token vocabulary to a multiple of 64: one TP shard.
        assert derived["rollout.vocab_layout"] == UNPADDED_512
        engine: Any = side.engine  # the _WorkersBreak built above
        engine.broken = True
        readback = side.readback()
    finally:
        side.close()
    for key in ("rollout.tensor_parallel_size", "rollout.dtype", "rollout.vocab_layout"):
        assert isinstance(readback[key], ReadbackFailure), (key, readback[key])
        assert "worker state is gone" in str(readback[key])
    rows = {a.path: a for a in apply_readback(_rollout_binding(), readback)}
    for path in ("rollout.dtype", "rollout.tensor_parallel_size"):
        assert rows[path].status == "error" and rows[path].actual is None
        assert "readback failed: RuntimeError: worker state is gone" in rows[path].evidence
    # The engine's resolved config was still readable: that knob is read back as usual.
    assert rows["rollout.enforce_eager"].status == "applied"
    derived, reported = split_readback(readback)
    assert derived["rollout.vocab_layout"].startswith("readback failed: RuntimeError")
    assert reported["rollout.dtype"].startswith("readback failed:")


@needs_hf
def test_training_layout_is_the_lm_head_as_built(model_record) -> None:
    from xconf.adapters.hf.model import TrainingScorerConfig
    from xconf.adapters.hf.side import TRAINING
    from xconf.adapters.hf.side_engine import HfScorerSide

    side = HfScorerSide(TrainingScorerConfig(model_path=model_record.path), TRAINING.readback)
    derived, _ = split_readback(side.readback())
    # Not vocab-parallel: the whole (unpadded) vocabulary in one shard on every rank.
    assert derived["training.vocab_layout"] == UNPADDED_512
    assert derived["training.world_size"] == 1  # derived too: the side's FSDP mesh
