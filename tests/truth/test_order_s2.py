"""Metamorphic: the whole S2 plan run forward and reversed gives bitwise identical scores.

Every case of ``+experiment=s2_cpu`` (the baseline and all twelve interventions, vLLM on
CPU) is run twice, the second time with the case order reversed. The runner groups cases by
rollout engine and reuses engines within a run, so reversing changes which engine is built
first and what each reused engine scored before a case. The prefix-caching case must show
real evidence in both orders: the identity's shared system prompt fills a whole KV block,
so the scored pass (after the warm-up pass) reads cache hits from the engine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.adapters.conftest import model_cache, needs_vllm
from tests.adapters.test_runtime_s2 import _runtime, _spec
from tests.truth.order import reversed_plan
from xconf.artifacts.store import read_json, read_tensors

pytestmark = [needs_vllm, pytest.mark.slow]
__all__ = ["model_cache"]  # the shared model-cache fixture, re-exported for pytest
CACHED = "rollout.enable_prefix_caching=True"


def _run(model_cache: str, out: Path, reverse: bool) -> Any:
    from xconf.session import prepare, run_prepared

    prepared = prepare(_spec([]), output_root=out, allow_smoke_operators=False, device="cpu")
    if reverse:
        prepared = reversed_plan(prepared)
    order: list[str] = []
    summary = run_prepared(
        prepared, _runtime(model_cache), resume=False, on_case=lambda r: order.append(r.label)
    )
    return summary, order


def _attempt(summary: Any, record: Any) -> Path:
    return Path(summary.experiment_dir, "cases", record.case_id, record.attempt_id)


@pytest.fixture(scope="module")
def both_orders(model_cache: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    out = tmp_path_factory.mktemp("order")
    return _run(model_cache, out / "forward", False), _run(model_cache, out / "backward", True)


def test_whole_plan_forward_and_reversed_score_bitwise_alike(both_orders: Any) -> None:
    (forward, forward_order), (backward, backward_order) = both_orders
    # The whole plan: the baseline and every intervention of conf/intervention/s2_cpu_oat.yaml.
    assert len(forward.records) == 13, [r.label for r in forward.records]
    # The runner groups cases by rollout engine: groups and the cases within them reversed.
    assert forward_order[0] == "baseline" and backward_order[0] != "baseline", backward_order
    # batch.size=1 reuses the baseline's engines: scored after the baseline, then before it.
    for order, before in ((forward_order, "baseline"), (backward_order, "batch.size=1")):
        first = min(("baseline", "batch.size=1"), key=order.index)
        assert first == before, order
    for a, b in zip(forward.records, backward.records, strict=True):
        assert a.case_id == b.case_id and a.result == b.result, (a, b)
        if a.result == "error":  # nothing was scored: the same refusal both ways
            assert a.reason == b.reason, (a, b)
            continue
        for name in ("score_rollout.safetensors", "score_training.safetensors"):
            fwd = read_tensors(_attempt(forward, a) / name)["logprobs"]
            bwd = read_tensors(_attempt(backward, b) / name)["logprobs"]
            same = fwd.numpy().tobytes() == bwd.numpy().tobytes()
            assert same, (a.label, name)


def test_prefix_caching_is_measured_from_engine_hits_in_both_orders(both_orders: Any) -> None:
    hits = []
    for summary, _ in both_orders:
        cached = next(r for r in summary.records if r.label == CACHED)
        # Exercised for real: an honest verdict on scores, never the zero-hit fallback error.
        assert cached.result in ("pass", "fail"), cached
        assert cached.intervention_applied, cached
        actual = read_json(_attempt(summary, cached) / "actual.json")
        readback = actual["readback"]["rollout"]
        rows = {a["path"]: a for a in actual["sides"]["rollout"]}
        assert rows["rollout.enable_prefix_caching"]["status"] == "applied", rows
        assert rows["rollout.enable_prefix_caching"]["actual"] is True, rows
        # Four prompts, each with the 152-token system prompt: one whole block apiece.
        block = readback["rollout.block_size"]
        assert readback["rollout.prefix_cache_hits"] >= 4 * block > 0, readback
        hits.append(readback["rollout.prefix_cache_hits"])
        # The cases without prefix caching read no hits at all (the cache is reset per case).
        base = next(r for r in summary.records if r.label == "baseline")
        base_readback = read_json(_attempt(summary, base) / "actual.json")["readback"]["rollout"]
        assert base_readback["rollout.prefix_cache_hits"] == 0, base_readback
    assert hits[0] == hits[1], hits


def test_tp2_records_each_workers_vocab_shard(both_orders: Any) -> None:
    (forward, _), _ = both_orders
    tp2 = next(r for r in forward.records if r.label == "rollout.tensor_parallel_size=2")
    derived = read_json(_attempt(forward, tp2) / "actual.json")["derived"]
    # vLLM's lm_head: 512 columns (already a multiple of 64) split over the two TP workers.
    assert derived["rollout"]["rollout.vocab_layout"]["shard_bounds"] == [[0, 256], [256, 512]]
    assert derived["rollout"]["rollout.world_size"] == 2
    # The training side keeps its own one-shard layout and world (one knob at a time).
    assert derived["training"]["training.vocab_layout"]["shard_bounds"] == [[0, 512]]
    assert derived["training"]["training.world_size"] == 1
