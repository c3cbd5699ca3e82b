"""One deterministic optimizer step on the training side (adapters/hf/update_step.py) on a
tiny Llama made with transformers' own classes, and the rollout engine built from the
pre-update state W0 then synced to W1 (``weight_sync_source``): the drift before and after
the sync, computed here independently (log_softmax + gather of transformers' own logits)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.adapters.archs import random_batch, write_checkpoint
from tests.adapters.conftest import needs_vllm
from xconf.errors import ConfigError

SHAPES = ((5, 6), (9, 6))


def _rows() -> dict[str, Any]:
    return random_batch(3, SHAPES).layout()


@pytest.mark.parametrize(
    ("node", "path"),
    [
        ({"optimizer": "sgd", "momentum": 0.9}, "identity.recipe.update.momentum"),
        ({"optimizer": "lion"}, "identity.recipe.update.optimizer"),
        ({"lr": 0}, "identity.recipe.update.lr"),
        ({"lr": True}, "identity.recipe.update.lr"),
        ({"loss": "mse"}, "identity.recipe.update.loss"),
        ([1], "identity.recipe.update"),
    ],
)
def test_a_bad_step_rule_is_a_coded_error_naming_the_key(node: Any, path: str) -> None:
    from xconf.adapters.hf.update_step import parse_step

    with pytest.raises(ConfigError) as info:
        parse_step(node)
    assert info.value.path == path and info.value.code.startswith("config.")


@pytest.fixture(scope="module")
def stepped(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from xconf.adapters.hf.update_step import parse_step, take_step

    root = tmp_path_factory.mktemp("step")
    w0 = write_checkpoint("llama", root / "w0")
    rule = parse_step({"optimizer": "sgd", "lr": 0.05})
    first = take_step(w0, _rows(), rule, root / "a")
    second = take_step(w0, _rows(), rule, root / "b")
    return w0, first, second


def test_the_step_is_bitwise_deterministic_and_changes_every_trained_tensor(stepped: Any) -> None:
    import torch
    from safetensors.torch import load_file

    from xconf.adapters.hf.update_step import WEIGHTS, tensors_digest

    w0, first, second = stepped
    a = (first.path / WEIGHTS).read_bytes()
    assert a == (second.path / WEIGHTS).read_bytes()  # two runs, bit for bit
    assert first.w1_digest == second.w1_digest and first.loss == second.loss
    before = load_file(str(w0 / "model.safetensors"))
    after = load_file(str(first.path / WEIGHTS))
    assert before.keys() == after.keys()
    changed = [n for n in before if not torch.equal(before[n], after[n])]
    assert "model.embed_tokens.weight" in changed and "lm_head.weight" in changed
    assert len(changed) == len(before)  # every tensor takes a gradient (nothing frozen)
    assert tensors_digest(after) == first.w1_digest != first.w0_digest
    assert not list(first.path.parent.glob(".one-step-*"))  # published atomically


def test_the_step_leaves_the_process_deterministic_setting_as_it_found_it(
    tmp_path: Path,
) -> None:
    import torch

    from xconf.adapters.hf.update_step import parse_step, take_step

    w0 = write_checkpoint("llama", tmp_path / "w0")
    assert not torch.are_deterministic_algorithms_enabled()
    take_step(w0, _rows(), parse_step({"optimizer": "sgd", "lr": 0.05}), tmp_path / "w1")
    assert not torch.are_deterministic_algorithms_enabled()  # the scorer's kernels unchanged


@pytest.mark.parametrize("same", [True, False], ids=["same-step", "other-bytes"])
def test_a_step_published_by_another_process_first_is_taken_only_when_it_is_w1(
    stepped: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, same: bool
) -> None:
    """Two runs stepping the same W0 on the same tokens race for one directory: the loser's
    rename fails, and it takes the winner's W1 only when that holds the recorded digest."""
    import shutil

    from safetensors.torch import load_file, save_file

    from xconf.adapters.hf import update_step
    from xconf.adapters.hf.update_step import WEIGHTS, parse_step, take_step

    w0, first, _ = stepped
    real_rename = update_step.os.rename

    def lose_the_race(src: str, dst: str) -> None:
        shutil.copytree(first.path, dst)  # the other process's directory lands first
        if not same:
            tensors = load_file(str(Path(dst) / WEIGHTS))
            name = sorted(tensors)[0]
            tensors[name] = tensors[name] + 1
            save_file(tensors, str(Path(dst) / WEIGHTS))
        real_rename(src, dst)  # onto a non-empty directory: OSError, as the loser sees it

    monkeypatch.setattr(update_step.os, "rename", lose_the_race)
    rule = parse_step({"optimizer": "sgd", "lr": 0.05})
    if same:
        record = take_step(w0, _rows(), rule, tmp_path)
        assert record.w1_digest == first.w1_digest and record.path.is_dir()
    else:
        with pytest.raises(OSError):
            take_step(w0, _rows(), rule, tmp_path)
    assert not list(tmp_path.glob(".one-step-*"))  # the loser's own copy is gone either way


def test_an_sgd_step_is_w0_minus_lr_times_the_gradient(stepped: Any) -> None:
    """Recomputed here: transformers' own logits, the mean NLL, autograd, W0 - lr * grad."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    w0, first, _ = stepped
    rows = _rows()
    model = AutoModelForCausalLM.from_pretrained(str(w0), torch_dtype=torch.float32)
    ids = torch.tensor(rows["token_ids"])
    logits = model(
        input_ids=ids,
        attention_mask=torch.tensor(rows["attention_mask"]),
        position_ids=torch.tensor(rows["position_ids"]),
    ).logits
    logp = logits.log_softmax(-1).gather(-1, torch.tensor(rows["selected_token_ids"])[..., None])
    active = torch.tensor(rows["active_mask"]).bool()
    loss = -logp[..., 0][active].mean()
    loss.backward()
    after = load_file(str(first.path / "model.safetensors"))
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        expected = p.detach() - 0.05 * p.grad
        assert torch.allclose(after[name], expected, atol=1e-6, rtol=0), name
    assert abs(float(loss.detach()) - first.loss) < 1e-5


def test_pre_update_state_names_w0_the_rule_the_tokens_and_w1(stepped: Any) -> None:
    from xconf.adapters.hf.update_step import tokens_digest

    _, first, _ = stepped
    state = first.pre_update_state
    assert f"W0 sha256:{first.w0_digest}" in state and f"W1 sha256:{first.w1_digest}" in state
    assert "optimizer=sgd lr=0.05 loss=mean_nll dtype=float32" in state
    assert f"tokens sha256:{tokens_digest(_rows())}" in state


def test_the_identity_digest_covers_the_step(stepped: Any) -> None:
    from dataclasses import replace

    from xconf.adapters.frozen import build_identity

    _, first, _ = stepped
    ident = build_identity(
        random_batch(3, SHAPES),
        checkpoint_id=f"sha256:{first.w1_digest}",
        model_version="tiny llama",
        tokenizer_id="t",
        pre_update_state=first.pre_update_state,
        scoring_mode="decode",
        recipe={},
    )
    other = replace(ident, pre_update_state=first.pre_update_state.replace("lr=0.05", "lr=0.1"))
    assert ident.digest() != other.digest()


def _hf_scores(path: Path) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    rows = _rows()
    model = AutoModelForCausalLM.from_pretrained(str(path), torch_dtype=torch.float32)
    with torch.no_grad():
        logits = model(
            input_ids=torch.tensor(rows["token_ids"]),
            attention_mask=torch.tensor(rows["attention_mask"]),
            position_ids=torch.tensor(rows["position_ids"]),
        ).logits
    logp = logits.log_softmax(-1).gather(-1, torch.tensor(rows["selected_token_ids"])[..., None])
    return logp[..., 0] * torch.tensor(rows["active_mask"])


@needs_vllm
def test_the_engine_built_from_w0_and_synced_scores_w1_as_a_fresh_load(stepped: Any) -> None:
    """Before: an engine holding W0 (built from it); after: the same engine synced to W1; the
    fresh load: an engine that loaded W1. The sync adds nothing (bitwise a fresh load), and
    the drift before and after is measured against transformers at W0 and W1."""
    import torch

    from xconf.adapters.vllm.engine import RolloutEngineConfig, VllmRolloutEngine
    from xconf.adapters.vllm.scorer import score_frozen

    w0, first, _ = stepped
    batch = random_batch(3, SHAPES)
    active = torch.tensor(batch.layout()["active_mask"]).bool()

    def scores(**kw: Any) -> tuple[Any, Any]:
        with VllmRolloutEngine(RolloutEngineConfig(**kw)) as engine:
            return score_frozen(engine, batch, "decode", 2), engine.weight_sync

    before, _ = scores(model_path=str(w0))
    loaded, _ = scores(model_path=str(first.path), tokenizer_path=str(w0))
    synced, record = scores(
        model_path=str(first.path),
        tokenizer_path=str(w0),
        weight_sync="reload",
        weight_sync_source=str(w0),
    )
    assert record.stale == () and record.source_rule.startswith("pre-update checkpoint")
    assert torch.equal(synced, loaded)  # the sync path adds no drift here: bit for bit
    assert not torch.equal(synced, before)  # the step moved the scores
    hf0, hf1 = _hf_scores(w0), _hf_scores(first.path)
    drift_before = (before - hf0).abs()[active].max()
    drift_after = (synced - hf1).abs()[active].max()
    moved = (hf1 - hf0).abs()[active].max()
    assert drift_before < 1e-4 and drift_after < 1e-4 < moved  # the step is well above drift
