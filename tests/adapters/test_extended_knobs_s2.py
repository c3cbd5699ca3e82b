"""The extended knobs through the vllm_hf runtime on CPU: each value reaches the
live engine and is read back, or is recorded ``unsupported`` with the engine's reason."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from tests.adapters.conftest import needs_vllm
from tests.adapters.test_runtime_s2 import _runtime, _spec
from xconf.experiment import Intervention

pytestmark = [needs_vllm, pytest.mark.slow]


@pytest.fixture(scope="module")
def extended_run(model_cache: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from xconf.session import prepare, run_prepared

    spec = replace(
        _spec([]),
        interventions=(
            Intervention("rollout.kv_cache_dtype", ("fp8",)),
            Intervention("rollout.max_num_batched_tokens", (64,)),
            Intervention("rollout.batch_invariant", (True,)),
            Intervention("training.param_dtype", ("bfloat16",)),
            Intervention("training.remove_padding", (True,)),
        ),
    )
    out = tmp_path_factory.mktemp("s2x")
    prepared = prepare(spec, output_root=out, allow_smoke_operators=False, device="cpu")
    summary = run_prepared(prepared, _runtime(model_cache), resume=False)
    rows = {r.label: r for r in summary.records}

    def actual(label: str) -> dict[str, Any]:
        row = rows[label]
        path = prepared.store.path / "cases" / row.case_id / row.attempt_id / "actual.json"
        document = json.loads(path.read_text())
        knobs = {k["path"]: k for side in document["sides"].values() for k in side}
        return {"knobs": knobs, "readback": document.get("readback", {})}

    return rows, actual


@pytest.mark.parametrize(
    ("label", "path", "value"),
    [
        ("baseline", "rollout.kv_cache_dtype", "auto"),
        ("baseline", "rollout.enable_chunked_prefill", True),
        ("baseline", "rollout.max_num_batched_tokens", 4096),
        ("baseline", "rollout.batch_invariant", False),
        ("baseline", "training.param_dtype", "none"),
        ("baseline", "training.remove_padding", False),
        ("rollout.kv_cache_dtype=fp8", "rollout.kv_cache_dtype", "fp8"),
        ("rollout.max_num_batched_tokens=64", "rollout.max_num_batched_tokens", 64),
        ("training.remove_padding=True", "training.remove_padding", True),
    ],
)
def test_value_is_read_back_from_the_live_engine(extended_run, label, path, value) -> None:
    rows, actual = extended_run
    record = actual(label)["knobs"][path]
    assert (record["status"], record["actual"]) == ("applied", value), record
    assert rows[label].result in ("pass", "fail"), rows[label].reason


def test_fp8_kv_cache_is_what_the_workers_hold_and_it_drifts(extended_run) -> None:
    rows, actual = extended_run
    workers = actual("rollout.kv_cache_dtype=fp8")["readback"]["rollout"]["rollout.worker_state"]
    assert "'kv_cache_dtypes': ['fp8']" in workers
    assert rows["rollout.kv_cache_dtype=fp8"].max_abs_diff > rows["baseline"].max_abs_diff


def test_packed_scoring_stays_within_the_float32_threshold(extended_run) -> None:
    rows, _ = extended_run
    assert rows["training.remove_padding=True"].result == "pass"


@pytest.mark.parametrize(
    ("label", "reason"),
    [
        ("rollout.batch_invariant=True", "Triton"),
        ("training.param_dtype=bfloat16", "unsharded"),
    ],
)
def test_what_this_machine_cannot_honour_is_an_error_with_the_reason(
    extended_run, label, reason
) -> None:
    rows, _ = extended_run
    assert rows[label].result == "error"
    assert "unsupported" in rows[label].reason and reason in rows[label].reason
