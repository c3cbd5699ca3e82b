"""A handler reads the runtime through its typed, public view: vllm_hf's TP handler splits
the frozen checkpoint by the model's own facts, and with nothing frozen it has none."""

from __future__ import annotations

from typing import Any

from tests.adapters.conftest import needs_hf
from xconf.adapters.checkpoint.runtime import CheckpointRuntime
from xconf.knobs import ROLLOUT_TENSOR_PARALLEL_SIZE
from xconf.runtime.materialization import materialize

pytestmark = needs_hf
TP = ROLLOUT_TENSOR_PARALLEL_SIZE.path


def test_the_tp_handler_splits_by_the_frozen_checkpoints_facts(model_record: Any) -> None:
    runtime = CheckpointRuntime("vllm", "hf")
    assert runtime.view().model is None  # nothing frozen: no facts to split by
    runtime._record = model_record
    view = runtime.view()
    assert (view.runtime_kind, view.device) == ("vllm-hf", "cpu")
    assert view.model is not None
    sizes = view.model.tp_sizes
    handlers = runtime.sides.spec("rollout").handlers
    allowed = materialize(handlers, view, TP, "rollout", max(sizes), {})
    assert (allowed.status, allowed.materialized) == ("applied", max(sizes))
    refused = next(t for t in range(2, 64) if t not in sizes)
    record = materialize(handlers, view, TP, "rollout", refused, {})
    assert record.status == "unsupported"
    assert record.evidence.endswith(f"(this model allows TP {', '.join(map(str, sizes))})")
