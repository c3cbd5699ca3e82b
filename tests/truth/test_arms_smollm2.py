"""On the real pretrained default, the full arm makes the float32 baseline pass, bit for bit.

``+experiment=s2_smollm2_arms`` (SmolLM2-135M-Instruct, 24 chat prompts, here 8 frozen tokens
each to stay quick) through the real ``xconf-run``, in the decode shape on the training side:
the baseline (transformers' own kernels) and the full arm (``training.align.all=vllm``). The
full arm's case passes the contract's float32 threshold with every active token bitwise equal
to vLLM's, and ``xconf verify`` re-derives both cases from what is sealed.

What the pass relies on holds on any CPU: both sides call vLLM's same CPU kernels (oneDNN GEMM,
cpu_attention, the C++ rotary) on the same weights, in the same step shapes (decode mode: the
engine's prefill of the request's prompts, then one token per sample), in one process with one
thread count; those kernels are deterministic for a given shape, ISA and thread count. The
baseline's own result is CPU-dependent (which tokens transformers' kernels move past 1e-5) and
is not asserted.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.adapters.conftest import needs_vllm
from tests.adapters.test_arch_matrix import results, run_xconf

pytestmark = [needs_vllm, pytest.mark.slow]

OVERRIDES = [
    "+experiment=s2_smollm2_arms",
    "runtime=vllm_hf",
    "identity.recipe.response_len=8",
    "training.scoring_mode=decode",
    "training.remove_padding=true",  # vLLM's prefill: the prompts back to back in one row
    "strategy=one_at_a_time",
    "pairwise_paths=[]",
    "interventions=[{path: training.align.all, values: [vllm]}]",
]


def test_the_full_arm_makes_the_real_default_pass_bitwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from xconf.artifacts.store import read_tensors
    from xconf.cli.main import main

    out = tmp_path / "out"
    code = run_xconf([*OVERRIDES, f"output_root={out}"], monkeypatch, tmp_path / "cwd")
    run = out / "s2-smollm2-arms"
    got = results(run)
    assert set(got) == {"baseline", "training.align.all=vllm"}, sorted(got)
    result, doc, attempt = got["training.align.all=vllm"]
    assert result == "pass" and doc["mismatches"] == 0, doc.get("reason") or doc.get("error")
    assert doc["active_tokens"] == 24 * 8 and attempt is not None
    rollout = read_tensors(attempt / "score_rollout.safetensors")["logprobs"]
    training = read_tensors(attempt / "score_training.safetensors")["logprobs"]
    active = read_tensors(attempt / "token_diffs.safetensors")["active_mask"].bool()
    assert rollout[active].numpy().tobytes() == training[active].numpy().tobytes()
    assert got["baseline"][0] in ("pass", "fail")  # a verdict; which one depends on the CPU
    assert code == (0 if got["baseline"][0] == "pass" else 1)
    assert main(["verify", str(run)]) == 0
