"""The fix search's mechanics on a checkpoint made with transformers' own Llama classes.

The tiny Llama (tests/adapters/archs.py) passes its float32 baseline: vLLM and transformers
agree. A drift is planted in *transformers'* RMS norm (its class forward scales the output by
1 + 1e-3: a norm kernel that computes differently from the rollout engine's), so the baseline
fails on the training side's own kernel. The rms_norm arm binds vLLM's norm to every norm
instance, which bypasses the planted class forward; no other arm does. So the search, started
at the first divergent module localize names (layer 0's attention output: the first tap after
a norm), must walk the arms in order and stop at the full arm, the first case whose own
sealed verdict passes. A plant in the embeddings, which no arm computes, ends with "no arm
removes the drift" and names where the full arm's case still diverges. Real engines
throughout (vLLM CPU, transformers); only the plant is ours.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from tests.adapters.archs import write_checkpoint
from tests.adapters.conftest import needs_vllm
from tests.adapters.test_arch_matrix import run_xconf

pytestmark = [needs_vllm, pytest.mark.slow]

SCALE = 1 + 1e-3
OVERRIDES = [
    "+experiment=s2_cpu",
    "runtime=vllm_hf",
    "identity.recipe.system_prompt=''",
    "identity.recipe.response_len=6",
    "interventions=[]",
]
LADDER = [
    "training.align.attention=vllm",
    "training.align.attention=vllm, training.align.activation=vllm",
    "training.align.attention=vllm, training.align.activation=vllm, training.align.logits=vllm",
    "training.align.all=vllm",
]


# arch -> (its modeling module, its RMS norm class): the plant's place in each.
NORMS = {
    "llama": ("transformers.models.llama.modeling_llama", "LlamaRMSNorm"),
    "qwen2": ("transformers.models.qwen2.modeling_qwen2", "Qwen2RMSNorm"),
    "qwen3": ("transformers.models.qwen3.modeling_qwen3", "Qwen3RMSNorm"),
    "mistral": ("transformers.models.mistral.modeling_mistral", "MistralRMSNorm"),
    "gemma2": ("transformers.models.gemma2.modeling_gemma2", "Gemma2RMSNorm"),
}


def _plant_norm(monkeypatch: pytest.MonkeyPatch, arch: str = "llama") -> None:
    import importlib

    module, name = NORMS[arch]
    norm = getattr(importlib.import_module(module), name)
    original = norm.forward

    def scaled(self, hidden_states):  # type: ignore[no-untyped-def]
        return original(self, hidden_states) * SCALE

    monkeypatch.setattr(norm, "forward", scaled)


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint("llama", tmp_path_factory.mktemp("llama") / "llama")


def _baseline(run: Path) -> str:
    for line in (run / "plan.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["kind"] == "baseline":
            return str(row["case_id"])
    raise AssertionError("no baseline row")


def _tree(path: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()
    }


def test_the_search_walks_the_arms_to_a_verified_fix(
    llama: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from xconf.artifacts.fix_record import latest
    from xconf.cli.main import main

    _plant_norm(monkeypatch)
    out = tmp_path / "out"
    argv = [*OVERRIDES, f"runtime.model.path={llama}", f"output_root={out}"]
    assert run_xconf(argv, monkeypatch, tmp_path / "cwd") == 1  # the planted baseline fails
    run = out / "s2-cpu"
    base = _baseline(run)
    capsys.readouterr()
    assert main(["fix", str(run), base]) == 0
    shown = capsys.readouterr().out
    record = latest(run, base)
    assert record is not None
    labels = [s["label"] for s in record["steps"]]
    assert labels == LADDER, labels
    assert record["start"]["tap"] == "layer 0 attention output", record["start"]
    assert [s["result"] for s in record["steps"]] == ["fail", "fail", "fail", "pass"]
    fix = record["verified"]
    assert fix is not None and fix["label"] == "training.align.all=vllm"
    assert fix["mismatches"] == 0 and fix["active_tokens"] > 0
    line = record["line"]
    assert line.startswith("verified fix: training.align.all=vllm (0 of ")
    assert f"; {fix['bitwise']} of {fix['active_tokens']} bitwise)" in line
    assert line in shown.replace("\n", " ") or line in shown
    # Each failing arm keeps the planted drift: its interval holds the failing case's drift.
    for step in record["steps"][:-1]:
        assert (
            step["effect"] is not None
            and step["effect"]["delta_low"] <= 0 <= step["effect"]["delta_high"]
        ), step
    assert record["steps"][-1]["effect"]["ratio_high"] < 0.5
    # The fix's cases are cases of the run: verify re-derives every one of them.
    assert main(["verify", str(run)]) == 0
    # Resume: the same search again scores nothing (every fix case is reused) and says the same.
    before = {s["case_id"]: s["attempt_id"] for s in record["steps"]}
    assert main(["fix", str(run), base]) == 0
    again = latest(run, base)
    assert again is not None and again["line"] == line
    assert {s["case_id"]: s["attempt_id"] for s in again["steps"]} == before
    # A passing case (the fix itself) is refused before anything is written.
    snapshot = _tree(run)
    capsys.readouterr()
    assert main(["fix", str(run), fix["case_id"]]) == 2
    assert "[fix.case_not_failing]" in capsys.readouterr().err
    assert _tree(run) == snapshot

    # A forged fix: a failing arm's sealed verdict edited to pass (and resealed) is damage to
    # verify, and the search scores that case again instead of calling it a fix.
    forged = tmp_path / "forged"
    shutil.copytree(run, forged / "s2-cpu")
    frun = forged / "s2-cpu"
    step = record["steps"][-2]
    _forge_pass(frun / "cases" / step["case_id"] / step["attempt_id"])
    assert main(["verify", str(frun)]) == 1
    shutil.rmtree(frun / "fix")
    assert main(["fix", str(frun), base]) == 0
    redone = latest(frun, base)
    assert redone is not None
    assert [s["result"] for s in redone["steps"]] == ["fail", "fail", "fail", "pass"]
    assert redone["steps"][-2]["attempt_id"] != step["attempt_id"]


def _forge_pass(attempt: Path) -> None:
    """comparison.json says pass with no mismatch; COMPLETE resealed with the new digest."""
    import hashlib

    doc = json.loads((attempt / "comparison.json").read_text())
    doc.update(result="pass", mismatches=0, mismatch_ratio=0.0)
    (attempt / "comparison.json").write_text(json.dumps(doc, sort_keys=True, indent=2) + "\n")
    seal = json.loads((attempt / "COMPLETE").read_text())
    seal["result"] = "pass"
    seal["files"]["comparison.json"] = hashlib.sha256(
        (attempt / "comparison.json").read_bytes()
    ).hexdigest()
    (attempt / "COMPLETE").write_text(json.dumps(seal, sort_keys=True, indent=2) + "\n")


def test_fix_true_on_a_drift_no_arm_computes(
    llama: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from transformers.models.llama import modeling_llama

    from xconf.artifacts.fix_record import latest

    original = modeling_llama.LlamaModel.forward

    def shifted_embeddings(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        handle = self.embed_tokens.register_forward_hook(lambda m, a, o: o * SCALE)
        try:
            return original(self, *args, **kwargs)
        finally:
            handle.remove()

    monkeypatch.setattr(modeling_llama.LlamaModel, "forward", shifted_embeddings)
    out = tmp_path / "out"
    argv = [*OVERRIDES, f"runtime.model.path={llama}", f"output_root={out}", "fix=true"]
    assert run_xconf(argv, monkeypatch, tmp_path / "cwd") == 1
    shown = capsys.readouterr().out
    run = out / "s2-cpu"
    record = latest(run, _baseline(run))
    assert record is not None and record["verified"] is None
    # localize's tap on the embeddings reads the lookup before the plant's hook (hooks run in
    # the order registered): the first module it sees diverge is the one reading them.
    assert record["start"]["tap"] == "layer 0 attention output", record["start"]
    assert record["steps"][-1]["label"] == "training.align.all=vllm"
    assert all(s["result"] == "fail" for s in record["steps"])
    line = record["line"]
    residual = record["residual"]
    assert residual["mismatches"] > 0 and residual["label"] == "training.align.all=vllm"
    assert line == (
        f"no arm removes the drift; the full arm leaves {residual['mismatches']} over, "
        "first divergence now at layer 0 attention output"
    ), line
    assert "no arm removes the drift" in shown
    assert any("forbids the training side a KV cache" in n for n in record["notes"])


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "mistral"])
def test_the_same_search_on_other_architectures(
    arch: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Qwen2, Qwen3 (whose attention normalizes q and k too) and Mistral, each made with
    transformers' own classes: the planted norm drift is removed by the full arm only, and the
    search says so with a verified fix."""
    from xconf.artifacts.fix_record import latest
    from xconf.cli.main import main

    ckpt = write_checkpoint(arch, tmp_path / arch)
    _plant_norm(monkeypatch, arch)
    out = tmp_path / "out"
    argv = [*OVERRIDES, f"runtime.model.path={ckpt}", f"output_root={out}"]
    assert run_xconf(argv, monkeypatch, tmp_path / "cwd") == 1
    run = out / "s2-cpu"
    base = _baseline(run)
    assert main(["fix", str(run), base]) == 0
    record = latest(run, base)
    assert record is not None and record["verified"] is not None, record and record["line"]
    assert record["verified"]["label"] == "training.align.all=vllm", record["line"]
    assert all(s["result"] == "fail" for s in record["steps"][:-1]), record["steps"]
    assert record["line"].startswith("verified fix: training.align.all=vllm (0 of ")


def test_the_search_on_an_architecture_the_arms_do_not_know(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Gemma2 (made with transformers' own classes) with the same planted norm drift: its
    baseline fails, and the search refuses as a whole before anything runs (every arm is bound
    first; each is a coded unsupported naming the architecture), exit 2, the run unchanged."""
    from xconf.cli.main import main

    ckpt = write_checkpoint("gemma2", tmp_path / "gemma2")
    _plant_norm(monkeypatch, "gemma2")
    out = tmp_path / "out"
    argv = [*OVERRIDES, f"runtime.model.path={ckpt}", f"output_root={out}"]
    assert run_xconf(argv, monkeypatch, tmp_path / "cwd") == 1
    run = out / "s2-cpu"
    base = _baseline(run)
    before = _tree(run)
    capsys.readouterr()
    assert main(["fix", str(run), base]) == 2
    err = capsys.readouterr().err
    assert "[fix.arms_unsupported]" in err and "Gemma2ForCausalLM" in err, err
    refused = set(re.findall(r"training\.align\.(\w+) unsupported", err))
    # (the logits arm is refused where the model is loaded, as in tests/adapters/test_arms_matrix)
    assert refused >= {"rms_norm", "linear", "rotary", "attention", "activation", "all"}, refused
    assert _tree(run) == before
