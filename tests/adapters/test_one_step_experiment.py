"""The one-step scenario as an experiment (issue 32, item 2): ``identity.recipe.update``.

A user's checkpoint W0 (a Llama made with transformers' own classes) freezes its tokens as
any recipe does; then one recorded optimizer step (``adapters/hf/update_step.py``) gives W1,
which every case scores. The baseline loads W1 on both sides (after the step, no sync
path); ``rollout.weight_sync=reload`` builds the rollout engine from W0 and sends it W1
through vLLM's weight-update path, as an RL loop does. The identity records the step
(``pre_update_state``), the tokens are the no-step twin's, and ``xconf verify`` re-derives
every case.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.adapters.archs import write_checkpoint
from tests.adapters.conftest import needs_vllm
from tests.commands import run_composed

pytestmark = [needs_vllm, pytest.mark.slow]
STEP = "{optimizer: sgd, lr: 0.05}"


def _run(checkpoint: Path, cache: str, out: Path, *extra: str) -> tuple[Any, Any]:
    overrides = [
        "+experiment=s2_cpu",
        "runtime=vllm_hf",
        f"runtime.model.path={checkpoint}",
        f"runtime.model_cache={cache}",
        "identity.recipe.response_len=6",
        *extra,
    ]
    return run_composed(overrides, out)


def _attempt(summary: Any, label: str) -> Path:
    (record,) = [r for r in summary.records if r.label == label]
    return Path(summary.experiment_dir) / "cases" / record.case_id / record.attempt_id


def _scores(attempt: Path) -> Any:
    from safetensors.torch import load_file

    return load_file(str(attempt / "token_diffs.safetensors"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("one_step")
    cache = str(root / "cache")
    w0 = write_checkpoint("llama", root / "llama")
    before, _ = _run(w0, cache, root / "before", "interventions=[]")
    after, adapter = _run(
        w0,
        cache,
        root / "after",
        f"+identity.recipe.update={STEP}",
        "+rollout.weight_sync=load",
        "interventions=[{path: rollout.weight_sync, values: [reload]}]",
    )
    return {"w0": w0, "before": before, "after": after, "adapter": adapter}


def test_the_step_is_in_the_identity_and_the_tokens_are_the_no_step_twin_s(runs: Any) -> None:
    before = json.loads((_attempt(runs["before"], "baseline") / "identity.json").read_text())
    after = json.loads((_attempt(runs["after"], "baseline") / "identity.json").read_text())
    for field in ("token_ids", "selected_token_ids", "active_mask", "attention_mask"):
        assert after[field] == before[field], field  # the same frozen tokens, sampled at W0
    assert after["checkpoint_id"] != before["checkpoint_id"]  # every case scores W1
    state = after["pre_update_state"]
    assert state.startswith("W0 sha256:") and "optimizer=sgd lr=0.05" in state, state
    recipe = after["recipe"]
    assert recipe["update"] == {"optimizer": "sgd", "lr": 0.05, "loss": "mean_nll"}
    w1 = Path(runs["adapter"].record.path)
    assert w1.name.startswith("one-step-") and w1 != Path(runs["w0"]).resolve()
    assert after["checkpoint_id"] == f"sha256:{runs['adapter'].record.checkpoint_sha256}"


def test_the_synced_engine_is_built_from_w0_and_scores_as_one_that_loaded_w1(runs: Any) -> None:
    import torch

    after = runs["after"]
    results = {r.label: r for r in after.records}
    assert set(results) == {"baseline", "rollout.weight_sync=reload"}, results
    for record in results.values():
        assert record.result in ("pass", "fail"), record.reason  # a verdict, not an error
    synced = _attempt(after, "rollout.weight_sync=reload")
    actual = json.loads((synced / "actual.json").read_text())
    text = json.dumps(actual)
    # the engine held W0 (the pre-update checkpoint) before the sync, not a perturbed copy
    assert "pre-update checkpoint" in text and "xconf-perturb" not in text, text[:2000]
    loaded, reloaded = _scores(_attempt(after, "baseline")), _scores(synced)
    # a complete float32 sync: the rollout's logprobs are bit for bit the loading engine's
    assert torch.equal(loaded["rollout_logprobs"], reloaded["rollout_logprobs"])
    assert torch.equal(loaded["training_logprobs"], reloaded["training_logprobs"])
    # and the step moved the scores: W1 is not W0
    before = _scores(_attempt(runs["before"], "baseline"))
    assert not torch.equal(before["training_logprobs"], loaded["training_logprobs"])


def test_verify_rederives_the_one_step_run(runs: Any, xconf_cli) -> None:
    rc, out, err = xconf_cli("verify", runs["after"].experiment_dir)
    assert rc == 0, out + err


def test_a_bad_step_rule_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    from xconf.errors import XconfError

    w0 = write_checkpoint("llama", tmp_path / "llama")
    with pytest.raises(XconfError) as info:
        _run(
            w0,
            str(tmp_path / "cache"),
            tmp_path / "out",
            "+identity.recipe.update={optimizer: lion}",
        )
    assert info.value.path == "identity.recipe.update.optimizer"
    assert not (tmp_path / "out").exists()
