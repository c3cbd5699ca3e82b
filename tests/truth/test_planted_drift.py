"""For every allow-listed knob, drift planted on that knob's case alone: that case alone fails
and that knob ranks first; with no drift planted every case passes with 0 mismatches."""

from __future__ import annotations

import copy

import pytest

from tests.core.runs import only, run_doc
from tests.truth.planted import PlantedRuntime
from xconf.knobs import KNOBS
from xconf.report.build import build_report

INTERVENTION = {
    "batch.size": 1,
    "rollout.tensor_parallel_size": 2,
    "rollout.context_parallel_size": 2,
    "training.sharding": "fsdp",
    "rollout.dtype": "bfloat16",
    "rollout.enable_prefix_caching": True,
    "rollout.enforce_eager": False,
    "training.attention_backend": "eager",
    "training.compute_dtype": "bfloat16",
    "logp.backend": "xconf.reference_logp",
}


def test_every_allow_listed_knob_is_planted() -> None:
    assert set(INTERVENTION) == set(KNOBS)


@pytest.fixture(scope="module")
def planted_doc(_s0_cached):
    doc = only(
        copy.deepcopy(_s0_cached), **{k.replace(".", "__"): [v] for k, v in INTERVENTION.items()}
    )
    return doc


def test_identical_float32_sides_pass_every_case_with_zero_mismatches(planted_doc, tmp_path):
    summary = run_doc(copy.deepcopy(planted_doc), tmp_path, adapter=PlantedRuntime())
    assert len(summary.records) == len(INTERVENTION) + 1
    assert {(r.result, r.mismatches, r.max_abs_diff) for r in summary.records} == {("pass", 0, 0.0)}


@pytest.mark.parametrize("knob", sorted(INTERVENTION))
def test_planted_drift_fails_that_case_alone_and_ranks_its_knob_first(
    planted_doc, tmp_path, knob
) -> None:
    runtime = PlantedRuntime(knob, INTERVENTION[knob])
    summary = run_doc(copy.deepcopy(planted_doc), tmp_path, adapter=runtime)
    failed = [r.label for r in summary.records if r.result != "pass"]
    assert failed == [f"{knob}={INTERVENTION[knob]}"]
    assert all(r.mismatches == 0 for r in summary.records if r.result == "pass")
    ranking = build_report(summary.experiment_dir).knob_ranking
    assert ranking[0].knob == knob
