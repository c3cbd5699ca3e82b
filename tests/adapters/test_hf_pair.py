"""The S1 hf_pair runtime reports what its reference scorer cannot do as unsupported."""

from __future__ import annotations

from typing import Any

from tests.adapters.conftest import needs_hf
from xconf.adapters.checkpoint.runtime import CheckpointRuntime
from xconf.runtime.materialization import materialize

pytestmark = needs_hf


def _hf_pair(model_record: Any) -> CheckpointRuntime:
    """conf/runtime/hf_pair.yaml's pairing, on the frozen tiny model."""
    runtime = CheckpointRuntime("hf", "hf", kind="hf-pair")
    runtime._record = model_record
    return runtime


def test_rollout_knobs_map_truthfully(model_record: Any) -> None:
    runtime = _hf_pair(model_record)
    view = runtime.view()
    rollout, training = (runtime.sides.spec(s).handlers for s in ("rollout", "training"))
    status = {
        (path, value): materialize(rollout, view, path, "rollout", value, {}).status
        for path, value in (
            ("rollout.dtype", "bfloat16"),
            ("rollout.enable_prefix_caching", False),
            ("rollout.enable_prefix_caching", True),
            ("rollout.enforce_eager", False),
            ("rollout.tensor_parallel_size", 2),
            ("rollout.context_parallel_size", 1),
        )
    }
    assert status == {
        ("rollout.dtype", "bfloat16"): "applied",
        ("rollout.enable_prefix_caching", False): "applied",
        ("rollout.enable_prefix_caching", True): "unsupported",
        ("rollout.enforce_eager", False): "unsupported",
        ("rollout.tensor_parallel_size", 2): "unsupported",
        ("rollout.context_parallel_size", 1): "applied",
    }
    fsdp = materialize(training, view, "training.sharding", "training", "fsdp", {})
    assert fsdp.status == "unsupported" and "torchrun" in fsdp.evidence  # no process group here


def test_a_knob_the_runtime_has_no_code_for_is_unsupported(
    model_record: Any, monkeypatch: Any
) -> None:
    from xconf.knobs import KNOBS, KnobSpec
    from xconf.runtime import protocol

    novel = KnobSpec("training.novel_knob", "engine_construction", "bool", "training", "test")
    monkeypatch.setattr(protocol, "KNOBS", {**KNOBS, novel.path: novel})
    runtime = _hf_pair(model_record)
    handlers = runtime.sides.spec("training").handlers
    record = materialize(handlers, runtime.view(), novel.path, "training", True, {})
    assert (record.status, record.materialized) == ("unsupported", None)
    assert "novel_knob" in record.evidence


def test_the_reference_reads_its_rollout_settings_from_its_own_state(model_record: Any) -> None:
    """The rollout side is a transformers scorer: each rollout knob's handler reads the value
    from what that scorer reports; a knob it has no reading for is absent (unobservable),
    never echoed from the request."""
    from xconf.adapters.hf.settings import ReferenceSettings
    from xconf.runtime.protocol import SideBinding
    from xconf.runtime.side import SideBuild

    runtime = _hf_pair(model_record)
    reference = runtime.sides.spec("rollout").build(
        ReferenceSettings(dtype="bfloat16"),
        SideBuild(SideBinding("rollout", (), "bfloat16", ()), None, runtime.shared()),  # type: ignore[arg-type]
    )
    got = reference.readback()
    assert got["rollout.dtype"] == "bfloat16"  # the scorer's parameters, read from the model
    assert (got["rollout.tensor_parallel_size"], got["rollout.enforce_eager"]) == (1, True)
    assert got["rollout.attention_backend"] == "sdpa"  # a reading, not a knob
    assert "rollout.max_num_batched_tokens" not in got
