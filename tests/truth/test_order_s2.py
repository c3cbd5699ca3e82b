"""Metamorphic: the S2 plan run forward and reversed gives bitwise identical scores per case.

Kept as small as it can be (three cases, one vLLM engine at a time, on CPU): the baseline and
``batch.size=1`` share one rollout engine, so reversing them changes what that engine scored
before each case; ``enable_prefix_caching=True`` exercises the warm-up/scored passes.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.adapters.conftest import model_cache, needs_vllm
from tests.adapters.test_runtime_s2 import _runtime, _spec
from xconf.artifacts.store import read_json, read_tensors
from xconf.experiment import Intervention

pytestmark = [needs_vllm, pytest.mark.slow]
__all__ = ["model_cache"]  # the shared model-cache fixture, re-exported for pytest


def _run(model_cache: str, out: Path, reverse: bool) -> Any:
    from xconf.session import prepare, run_prepared

    spec = replace(
        _spec([]),
        interventions=(
            Intervention("batch.size", (1,)),
            Intervention("rollout.enable_prefix_caching", (True,)),
        ),
    )
    prepared = prepare(spec, output_root=out, allow_smoke_operators=False, device="cpu")
    if reverse:
        cases = prepared.execution.cases
        flipped = tuple(
            replace(c, case=replace(c.case, index=len(cases) - 1 - i))
            for i, c in enumerate(reversed(cases))
        )
        prepared = replace(prepared, execution=replace(prepared.execution, cases=flipped))
    order: list[str] = []
    summary = run_prepared(
        prepared, _runtime(model_cache), resume=False, on_case=lambda r: order.append(r.label)
    )
    return summary, order


def test_forward_and_reversed_orders_score_bitwise_alike(model_cache, tmp_path) -> None:
    forward, forward_order = _run(model_cache, tmp_path / "forward", reverse=False)
    backward, backward_order = _run(model_cache, tmp_path / "backward", reverse=True)
    # The runner groups cases by rollout engine; within that, the order really changed.
    assert forward_order != backward_order, forward_order
    for a, b in zip(forward.records, backward.records, strict=True):
        assert a.case_id == b.case_id and a.result == b.result, (a, b)
        if a.result == "error":  # nothing was scored: the same refusal both ways
            assert a.reason == b.reason, (a, b)
            continue
        for name in ("score_rollout.safetensors", "score_training.safetensors"):
            first = read_tensors(
                Path(forward.experiment_dir, "cases", a.case_id, a.attempt_id, name)
            )
            second = read_tensors(
                Path(backward.experiment_dir, "cases", b.case_id, b.attempt_id, name)
            )
            same = first["logprobs"].numpy().tobytes() == second["logprobs"].numpy().tobytes()
            assert same, (a.label, name)
    cached = next(r for r in forward.records if r.label == "rollout.enable_prefix_caching=True")
    actual = read_json(
        Path(forward.experiment_dir, "cases", cached.case_id, cached.attempt_id, "actual.json")
    )
    hits = actual["readback"]["rollout"]["rollout.prefix_cache_hits"]
    rows = {a["path"]: a for a in actual["sides"]["rollout"]}
    # The evidence decides: hits read from the engine make it applied; none make it a fallback.
    status = rows["rollout.enable_prefix_caching"]["status"]
    assert (hits > 0 and status == "applied") or (hits == 0 and cached.result == "error")
