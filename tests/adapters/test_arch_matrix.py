"""The architecture matrix: checkpoints made with transformers' own classes, through xconf-run.

Each architecture (Llama, Qwen2, Qwen3, Mistral, Gemma2, Phi3, GPT-2, and a Llama config
without ``num_key_value_heads``) is saved with ``save_pretrained`` beside a ``tokenizers``
BPE trained in-process (tests/adapters/archs.py), then run through ``xconf-run``'s own
``main()`` on vLLM + transformers: a float32 baseline and ``rollout.dtype=bfloat16``. Every
result is the one docs/models.md lists; a case that cannot run says why in its own code.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.adapters.archs import ARCHS, VARIANTS, write_checkpoint
from tests.adapters.conftest import needs_vllm

pytestmark = [needs_vllm, pytest.mark.slow]

# arch -> (baseline, rollout.dtype=bfloat16), as docs/models.md lists them.
MATRIX = {
    "llama": ("pass", "pass"),
    "qwen2": ("pass", "pass"),
    "qwen3": ("pass", "pass"),
    "mistral": ("pass", "pass"),
    "gemma2": ("pass", "pass"),
    "phi3": ("pass", "pass"),
    "gpt2": ("pass", "pass"),
    "llama-no-kv": ("pass", "pass"),
}
# arch -> (code, what the error names): checkpoints xconf refuses with a coded exit 2 that
# writes nothing. Only vLLM can tell that its Gemma2 has no lm_head to load an untied head
# into: that refusal comes from the engine that samples the identity, before any write.
REFUSED: dict[str, tuple[str, str]] = {
    "gemma2-untied": ("model.load_failed", "There is no module or parameter named 'lm_head'"),
}
OVERRIDES = [
    "+experiment=s2_cpu",
    "runtime=vllm_hf",
    # Short prompts and responses: the matrix is about loading and reading back, not drift.
    "identity.recipe.system_prompt=''",
    "identity.recipe.response_len=6",
    "interventions=[{path: rollout.dtype, values: [bfloat16]}]",
]


def results(run_dir: Path) -> dict[str, tuple[str, Any, Path | None]]:
    """Case label -> (result, comparison document, attempt directory) of a finished run."""
    out: dict[str, tuple[str, Any, Path | None]] = {}
    for line in (run_dir / "plan.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "case_id" not in row:
            continue
        label = (
            "baseline"
            if row["kind"] == "baseline"
            else ",".join(f"{k}={v}" for k, v in sorted(row["changed"].items()))
        )
        attempts = sorted((run_dir / "cases" / row["case_id"]).glob("a-*/comparison.json"))
        doc = json.loads(attempts[-1].read_text()) if attempts else {"result": "missing"}
        out[label] = (str(doc["result"]), doc, attempts[-1].parent if attempts else None)
    return out


def run_xconf(argv: list[str], monkeypatch: pytest.MonkeyPatch, cwd: Path) -> int:
    from xconf.cli import hydra_app

    cwd.mkdir(parents=True, exist_ok=True)
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "argv", ["xconf-run", *argv])
    with pytest.raises(SystemExit) as info:
        hydra_app.main()
    return int(info.value.code or 0)


@pytest.mark.parametrize("arch", [*ARCHS, *VARIANTS])
def test_arch_matrix(arch: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    ckpt = write_checkpoint(arch, tmp_path / arch)
    out = tmp_path / "out"
    code = run_xconf(
        [*OVERRIDES, f"runtime.model.path={ckpt}", f"output_root={out}"],
        monkeypatch,
        tmp_path / "cwd",
    )
    err = capsys.readouterr().err
    if arch in REFUSED:  # a coded exit 2 naming file and field, before anything is written
        code_name, named = REFUSED[arch]
        assert code == 2 and f"[{code_name}]" in err and named in err, (code, err[-2000:])
        assert str(ckpt) in err
        assert not out.exists()
        return
    got = results(out / "s2-cpu")
    seen = (got["baseline"][0], got["rollout.dtype=bfloat16"][0])
    reasons = {k: v[1].get("reason") or v[1].get("error") for k, v in got.items()}
    assert seen == MATRIX[arch], (arch, seen, reasons)
    assert code == (0 if seen == ("pass", "pass") else 1), (code, err[-2000:])
    # The rollout compute dtype is read back from the engine, whatever dtypes its
    # parameters keep (Qwen2 keeps some in float32).
    for label, want in (("baseline", "float32"), ("rollout.dtype=bfloat16", "bfloat16")):
        attempt = got[label][2]
        if got[label][0] == "error" or attempt is None:
            continue
        apps = json.loads((attempt / "actual.json").read_text())["sides"]["rollout"]
        read = {a["path"]: a["actual"] for a in apps}
        assert read["rollout.dtype"] == want, (arch, label, read["rollout.dtype"])
    # The bfloat16 rollout case took the baseline's training scores (scored once per run),
    # and verify re-derives that from the two attempts.
    baseline, bf16 = got["baseline"][2], got["rollout.dtype=bfloat16"][2]
    if baseline is not None and bf16 is not None and got["baseline"][0] != "error":
        reused = json.loads((bf16 / "actual.json").read_text())["reused_sides"]
        assert reused["training"]["attempt_id"] == baseline.name, (arch, reused)
        from xconf.verify import verify_run

        assert verify_run(out / "s2-cpu").exit_code == 0, arch
