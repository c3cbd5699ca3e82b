"""For every allow-listed knob, drift planted on that knob's case alone: that case alone fails
and that knob ranks first; with no drift planted every case passes with 0 mismatches."""

from __future__ import annotations

import copy

import pytest

from tests.core.runs import only, run_doc
from tests.truth.planted import PlantedRuntime
from xconf.knobs import KNOBS
from xconf.report.build import build_report

# Hand-picked values for the original knobs; any knob added later gets a derived one.
PICKED = {
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


def _extended_baseline(path: str) -> object:
    """A baseline value for a knob the v1 S0 baseline does not declare (extended knobs)."""
    spec = KNOBS[path]
    if spec.kind == "bool":
        return False
    if spec.kind == "positive_int":
        return 64
    if spec.kind in ("positive_float", "nonnegative_float", "probability"):
        return 1.0
    if spec.kind == "top_k":
        return 0
    if spec.kind == "dtype":
        return "float32"
    values = set((spec.choices or {}).values())
    return next((v for v in ("none", "auto") if v in values), min(values))


def _s0_baseline() -> dict:
    from tests.conftest import S0_JSON, load_json

    baseline = load_json(S0_JSON)["baseline"]
    return {f"{group}.{k}": v for group, knobs in baseline.items() for k, v in knobs.items()}


S0_BASELINE = _s0_baseline()
BASELINE = {k: S0_BASELINE[k] if k in S0_BASELINE else _extended_baseline(k) for k in KNOBS}


def _derived(path: str, base: object) -> object:
    spec = KNOBS[path]
    if spec.kind == "bool":
        return not base
    if spec.kind == "positive_int":
        return int(base) + 1 if isinstance(base, int) else 2
    if spec.kind in ("positive_float", "nonnegative_float"):
        return float(base) * 2 if isinstance(base, int | float) else 2.0
    if spec.kind == "probability":
        return 0.5
    if spec.kind == "top_k":
        return 50
    if spec.kind == "dtype":
        return "bfloat16" if base != "bfloat16" else "float32"
    choices = sorted(set((spec.choices or {}).values()))
    return next(c for c in choices if c != base)


INTERVENTION = {k: PICKED[k] if k in PICKED else _derived(k, BASELINE.get(k)) for k in KNOBS}


def test_every_allow_listed_knob_is_planted() -> None:
    assert set(INTERVENTION) == set(KNOBS)


@pytest.fixture(scope="module")
def planted_doc(_s0_cached):
    doc = copy.deepcopy(_s0_cached)
    doc["schema_version"] = "cross_config.experiment_config.v2"  # extended knobs too
    for path, value in BASELINE.items():
        group, name = path.split(".", 1)
        doc["baseline"].setdefault(group, {})[name] = value
    return only(doc, **{k.replace(".", "__"): [v] for k, v in INTERVENTION.items()})


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
