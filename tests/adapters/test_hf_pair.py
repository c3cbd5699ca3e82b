"""The S1 hf_pair runtime reports what its reference scorer cannot do as unsupported."""

from __future__ import annotations

from typing import Any

from tests.adapters.conftest import needs_hf
from xconf.adapters.real.hf_pair import HfPairRuntime

pytestmark = needs_hf


def test_rollout_knobs_map_truthfully(model_record: Any) -> None:
    runtime = HfPairRuntime()
    runtime._record = model_record
    status = {
        (path, value): runtime._materialize(path, "rollout", value).status
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
    fsdp = runtime._materialize("training.sharding", "training", "fsdp")
    assert fsdp.status == "unsupported" and "torchrun" in fsdp.evidence  # no process group here
