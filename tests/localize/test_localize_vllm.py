"""`xconf localize` through the in-process vLLM engine's model: a perturbation planted in
the rollout side's layer 1 MLP is named; the float32 baseline gives a finite floor."""

from __future__ import annotations

import pytest

from tests.adapters.conftest import needs_vllm
from tests.localize import planted
from xconf.localize.service import localize_case

pytestmark = [needs_vllm, pytest.mark.slow]
PLANT = {"side": "rollout", "module": "model.layers.1.mlp", "factor": 1 + 1e-3}


def test_planted_rollout_mlp_is_named(model_cache, tmp_path) -> None:
    summary = planted.run(
        planted.experiment("planted-vllm", planted.OPERATOR_CASE),
        tmp_path,
        planted.runtime("vllm_hf", PLANT, layers=2),
    )
    case = next(r for r in summary.records if r.label != "baseline")
    assert case.result == "fail"
    result = localize_case(
        summary.experiment_dir, case.case_id, adapter=planted.runtime("vllm_hf", PLANT, layers=2)
    )
    doc = result.document
    assert result.line == "first divergence: layer 1 MLP output"
    rows = {r["key"]: r for r in doc["taps"]}
    assert doc["taps"][0]["key"] == "embedding" and rows["embedding"]["case_relative"] == 0.0
    # vLLM's kernels against transformers' in float32: a small, non-zero cross-side floor
    assert 0 < rows["layers.0.attention"]["baseline_cross"] < 1e-5
    assert rows["layers.0.attention"]["rollout_repeat"] == 0.0  # deterministic on CPU
    assert not any(r["above"] for r in doc["taps"][: doc["taps"].index(rows["layers.1.mlp"])])
    assert abs(rows["layers.1.mlp"]["case_relative"] - 1e-3) < 1e-4
