"""The arms through ``xconf-run`` on checkpoints made with transformers' own classes.

Each architecture runs the arms' cases (``intervention=arms``) of ``+experiment=s2_cpu`` on its
own tiny checkpoint (vLLM against transformers, 4 prompts x 6 frozen tokens): every arm
alone, the full arm, the decode shape, the full arm in the decode shape, and
``rollout.scoring_mode=prefill``. Llama,
Qwen2, Qwen3 and Mistral give a verdict for every arm, and the full arm in the decode shape
gives the rollout's own bits on both sides; Gemma2's layout is not one the arms know, so each
arm case is a coded ``unsupported`` (strict execution: ``error``), never a silent ``off``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.adapters.archs import write_checkpoint
from tests.adapters.conftest import needs_vllm
from tests.adapters.test_arch_matrix import results, run_xconf

pytestmark = [needs_vllm, pytest.mark.slow]

ARMS = ("rms_norm", "linear", "rotary", "attention", "activation", "logits", "all")
PAIR = "training.align.all=vllm,training.scoring_mode=decode"
OVERRIDES = [
    "+experiment=s2_cpu",
    "runtime=vllm_hf",
    "intervention=arms",
    "strategy=pairwise",
    "pairwise_paths=[[training.align.all,training.scoring_mode]]",
    "identity.cache_metadata.training_kv_cache=allowed",
    # Short prompts and responses: the matrix is about each arm applying, not about drift.
    "identity.recipe.system_prompt=''",
    "identity.recipe.response_len=6",
]


def _run(arch: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[int, dict]:
    ckpt = write_checkpoint(arch, tmp_path / arch)
    out = tmp_path / "out"
    argv = [*OVERRIDES, f"runtime.model.path={ckpt}", f"output_root={out}"]
    code = run_xconf(argv, monkeypatch, tmp_path / "cwd")
    return code, results(out / "s2-cpu")


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral"])
def test_every_arm_gives_a_verdict(arch: str, tmp_path: Path, monkeypatch) -> None:
    code, got = _run(arch, tmp_path, monkeypatch)
    reasons = {k: v[1].get("reason") or v[1].get("error") for k, v in got.items()}
    for label, (result, _doc, _attempt) in got.items():
        assert result in ("pass", "fail"), (arch, label, reasons[label])
    assert len(got) == 11, sorted(got)
    pair = got[PAIR]
    from xconf.artifacts.store import read_tensors

    attempt = pair[2]
    assert attempt is not None
    rollout = read_tensors(attempt / "score_rollout.safetensors")["logprobs"]
    training = read_tensors(attempt / "score_training.safetensors")["logprobs"]
    active = read_tensors(attempt / "token_diffs.safetensors")["active_mask"].bool()
    assert pair[0] == "pass" and bool((rollout[active] == training[active]).all()), arch
    actual = json.loads((attempt / "actual.json").read_text())["sides"]["training"]
    read = {a["path"]: (a["status"], a["actual"]) for a in actual}
    for kind in ARMS:
        assert read[f"training.align.{kind}"] == ("applied", "vllm"), (kind, read)
    assert read["training.scoring_mode"] == ("applied", "decode")
    assert code in (0, 1)


def test_gemma2_arms_are_coded_unsupported(tmp_path: Path, monkeypatch) -> None:
    code, got = _run("gemma2", tmp_path, monkeypatch)
    assert got["baseline"][0] == "pass"
    for kind in ARMS:
        result, doc, _ = got[f"training.align.{kind}=vllm"]
        error = doc.get("error") or {}
        assert result == "error" and "unsupported" in error.get("message", ""), (kind, doc)
        assert "Gemma2ForCausalLM" in error["message"]
    assert code == 1
