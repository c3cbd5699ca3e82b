"""A run with ``runtime.model.path`` and a recipe identity localizes as any other.

A user's checkpoint (a transformers ``LlamaForCausalLM`` saved with ``save_pretrained``, a
``tokenizers`` BPE) scored by ``+experiment=s2_cpu runtime=vllm_hf`` with a JSONL prompt
set: freezing records where the tokenizer is and the dataset's digest in the recipe, and
the checkpoint path is a runtime option. `xconf localize RUN CASE` must re-read all of it:
before, it exited 2 with ``config.unknown_key at 'identity.recipe.tokenizer_path'``, and
it would have rebuilt the runtime's default tiny model instead of the user's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.adapters.archs import write_checkpoint
from tests.adapters.conftest import needs_vllm
from tests.commands import run_composed
from tests.inputs.datasets import write_jsonl
from xconf.artifacts.localization import latest

pytestmark = [needs_vllm, pytest.mark.slow]
PROMPTS = [{"prompt": "the rollout engine samples"}, {"prompt": "one two three four"}]


def test_a_local_checkpoint_run_with_a_dataset_localizes(
    model_cache: str, tmp_path: Path, xconf_cli
) -> None:
    checkpoint = write_checkpoint("llama", tmp_path / "llama")
    data = write_jsonl(tmp_path / "prompts.jsonl", PROMPTS)
    overrides = [
        "+experiment=s2_cpu",
        "runtime=vllm_hf",
        f"runtime.model.path={checkpoint}",
        "interventions=[]",
        f"identity.recipe.dataset.path={data}",
        "identity.recipe.dataset.max_tokens=4",
    ]
    summary, adapter = run_composed(overrides, tmp_path / "out")
    (baseline,) = summary.records
    assert baseline.result in ("pass", "fail"), baseline.reason
    run = Path(summary.experiment_dir)
    attempt = run / "cases" / baseline.case_id / baseline.attempt_id
    recipe = json.loads((attempt / "identity.json").read_text())["recipe"]
    assert "tokenizer_path" in recipe and recipe["dataset"]["sha256"]  # what freezing adds

    rc, out, err = xconf_cli("localize", run, baseline.case_id)
    assert rc == 0, err
    assert out.strip().splitlines()[-1].startswith("first divergence: ")
    doc = latest(run, baseline.case_id)
    assert doc is not None and doc["architecture"] == "LlamaForCausalLM"
    # the user's checkpoint, not the runtime's default model, verified against the identity
    assert doc["checkpoint_sha256"] == adapter.record.checkpoint_sha256
    assert doc["checkpoint_verified"] is True
    assert doc["floor_definition"].startswith("the case is the baseline")
    cross = {r["key"]: r["baseline_cross"] for r in doc["taps"]}
    assert 0 < cross["logits"] < 1e-4, cross  # vLLM against transformers, float32
    # verify and report re-read the same run (the localization beside it included)
    rc, out, err = xconf_cli("verify", run)
    assert rc == 0, out + err
    rc, out, err = xconf_cli("report", run)
    assert rc == 0 and (run / "report.html").is_file(), err
    assert doc["line"] in (run / "report.html").read_text()
