"""`xconf localize` through the Megatron training side's ``GPTModel`` (``vllm_megatron``): a
perturbation planted in its layer 1 MLP (Megatron's ``decoder.layers.1.mlp``, whose output
is ``(output, bias)``, sequence-first) is named; vLLM against Megatron in float32 gives a
small, finite floor at every tap, so the name map pairs the same activations."""

from __future__ import annotations

import pytest

from tests.adapters.conftest import needs_vllm
from tests.localize import planted
from tests.megatron.conftest import needs_megatron
from xconf.localize.names import name_map, taps
from xconf.localize.service import localize_case

pytestmark = [needs_vllm, needs_megatron, pytest.mark.slow]
PLANT = {"side": "training", "module": "decoder.layers.1.mlp", "factor": 1 + 1e-3}


def test_planted_megatron_mlp_is_named(model_cache, tmp_path) -> None:
    summary = planted.run(
        planted.experiment("planted-megatron", planted.OPERATOR_CASE),
        tmp_path,
        planted.runtime("vllm_megatron", PLANT, layers=2),
    )
    case = next(r for r in summary.records if r.label != "baseline")
    assert case.result == "fail"
    result = localize_case(
        summary.experiment_dir,
        case.case_id,
        adapter=planted.runtime("vllm_megatron", PLANT, layers=2),
    )
    doc = result.document
    assert result.line == "first divergence: layer 1 MLP output"
    assert doc["sides"] == {"rollout": "vllm", "training": "megatron"}
    names = name_map(doc["architecture"], "test")
    assert [r["modules"]["training"] for r in doc["taps"]] == [
        names.module("megatron", t).module for t in taps(2)
    ]
    rows = {r["key"]: r for r in doc["taps"]}
    assert rows["embedding"]["case_relative"] == 0.0
    # vLLM's kernels against Megatron's in float32: every tap at rounding level, so each
    # pair of modules carries the same activation.
    cross = {k: r["baseline_cross"] for k, r in rows.items()}
    assert all(0 <= v < 1e-4 for v in cross.values()), cross
    assert rows["layers.0.attention"]["training_repeat"] == 0.0  # deterministic on CPU
    assert not any(r["above"] for r in doc["taps"][: doc["taps"].index(rows["layers.1.mlp"])])
    assert abs(rows["layers.1.mlp"]["case_relative"] - 1e-3) < 1e-4
