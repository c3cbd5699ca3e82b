"""The collector while an in-process vLLM engine lives: frozen once, the engine never frozen.

The guarantee that matters is memory: a closed engine's weights are gone when ``close``
returns, with no collection left to the caller; and nothing stays frozen between engines.
"""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest

from tests.adapters.conftest import needs_vllm
from xconf.adapters.vllm import heap


def test_vllm_freeze_calls_are_skipped_only_inside_the_block() -> None:
    freeze, unfreeze = gc.freeze, gc.unfreeze
    with heap.vllm_gc_calls_skipped():
        gc.freeze()
        assert gc.get_freeze_count() == 0
        gc.unfreeze()
    assert (gc.freeze, gc.unfreeze) == (freeze, unfreeze)


def test_vllm_freeze_calls_come_back_after_an_error() -> None:
    freeze = gc.freeze
    with pytest.raises(RuntimeError), heap.vllm_gc_calls_skipped():
        raise RuntimeError("a build that failed")
    assert gc.freeze is freeze


def test_hold_freezes_once_and_the_last_release_unfreezes() -> None:
    assert gc.get_freeze_count() == 0
    heap.hold()
    heap.hold()
    held = gc.get_freeze_count()
    assert held > 0
    heap.released()
    assert gc.get_freeze_count() == held  # one engine still holds it
    heap.released()
    assert gc.get_freeze_count() == 0
    heap.released()  # a second close of the same engine changes nothing
    assert gc.get_freeze_count() == 0


def test_an_object_made_while_held_is_collected_at_release() -> None:
    class Cyclic:
        pass

    heap.hold()
    made = Cyclic()
    made.self = made  # type: ignore[attr-defined]  # only a collection frees a cycle
    ref = weakref.ref(made)
    del made
    heap.released()
    assert ref() is None


@needs_vllm
@pytest.mark.slow
def test_closed_engine_weights_are_gone_when_close_returns(model_record: Any) -> None:
    from xconf.adapters.vllm.engine import RolloutEngineConfig, VllmRolloutEngine

    assert gc.get_freeze_count() == 0
    engine = VllmRolloutEngine(RolloutEngineConfig(model_path=model_record.path))
    assert gc.get_freeze_count() > 0  # the heap from before the engine: frozen once
    model = engine.llm.llm_engine.model_executor.driver_worker.worker.model_runner.model
    weights = weakref.ref(next(model.parameters()))
    collectable = {id(o) for o in gc.get_objects()}  # frozen objects are left out
    assert id(model) in collectable, "vLLM's own freeze ran: the engine's objects were frozen"
    del model
    engine.close()
    assert weights() is None
    assert gc.get_freeze_count() == 0
