"""Every architecture of the matrix localizes, on checkpoints made with transformers' own
classes (tests/adapters/archs.py), vLLM against transformers.

The baseline of each is localized against itself: its taps must all fire on both sides,
and every tap's float32 cross-engine difference must be at rounding level. A tap whose two
sides name different activations (a pre- and a post-soft-cap logit, a scaled and an
unscaled embedding, an attention output against a residual) differs by far more, so this
fails for any name map that does not fit the architecture.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.adapters.archs import write_checkpoint
from tests.adapters.conftest import needs_vllm
from xconf.adapters.frozen import FrozenBatch, FrozenSample
from xconf.localize.names import can_tap, name_map, taps
from xconf.localize.service import localize_case

pytestmark = [needs_vllm, pytest.mark.slow]
SAMPLES = (
    FrozenSample((11, 42, 7, 99, 3), (250, 17, 64, 8, 301, 5)),
    FrozenSample((5, 6, 7), (380, 22, 13, 77, 2, 140, 9)),
)
# archs.py's name for each architecture of the matrix (Llama: test_localize_recipe.py, a
# user checkpoint with a recipe identity)
MATRIX = {
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Phi3ForCausalLM": "phi3",
    "Gemma2ForCausalLM": "gemma2",
    "GPT2LMHeadModel": "gpt2",
}
CROSS_ROUNDING = 1e-4  # float32 vLLM against transformers: ~1e-7 .. 1e-5 on these models


def _experiment(experiment_id: str) -> dict[str, Any]:
    from tests.localize.planted import experiment

    doc = experiment(experiment_id, [])
    doc["identity"] = {
        **doc["identity"],
        **FrozenBatch(SAMPLES, 0).layout(),
        "checkpoint_id": f"transformers-built:{experiment_id}",
    }
    return doc


def _run(architecture: str, root: Path) -> tuple[Any, Any]:
    from xconf.config.strict import parse_experiment
    from xconf.localize.replay import runtime_for
    from xconf.session import prepare, run_prepared

    checkpoint = write_checkpoint(MATRIX[architecture], root / "checkpoint")
    recorded = {
        "target": "xconf.adapters.checkpoint.runtime:CheckpointRuntime",
        "options": {"rollout": "vllm", "training": "hf", "model": {"path": str(checkpoint)}},
    }
    spec = parse_experiment(_experiment(architecture.lower()))
    prepared = prepare(spec, output_root=root / "out", allow_smoke_operators=False, device="cpu")
    summary = run_prepared(prepared, runtime_for("vllm_hf", recorded), resume=True)
    return summary, checkpoint


@pytest.mark.parametrize("architecture", sorted(MATRIX))
def test_every_architecture_localizes(architecture: str, model_cache: str, tmp_path) -> None:
    summary, checkpoint = _run(architecture, tmp_path)
    (baseline,) = summary.records
    assert baseline.result in ("pass", "fail"), baseline.reason
    # No adapter handed over: localize rebuilds the run's own from actual.json's provenance
    # (the checkpoint path included).
    result = localize_case(summary.experiment_dir, baseline.case_id)
    doc = result.document
    assert doc["architecture"] == architecture
    assert [r["key"] for r in doc["taps"]] == [t.key for t in taps(2)]
    first = doc["first_divergence"]
    assert result.line == ("first divergence: " + first["label"] if first else result.line)
    cross = {r["key"]: r["baseline_cross"] for r in doc["taps"]}
    assert all(0 <= v < CROSS_ROUNDING for v in cross.values()), cross
    assert cross["logits"] > 0  # two engines: the kernels differ somewhere
    assert can_tap(architecture) is None
    names = name_map(architecture, "test")
    assert {t["modules"]["training"] for t in doc["taps"]} == {
        names.module("hf", t).module for t in taps(2)
    }
    del checkpoint
