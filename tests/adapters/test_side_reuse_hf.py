"""Side reuse on a checkpoint transformers built itself, through xconf-run: bitwise either way.

A Llama saved with ``save_pretrained`` (tests/adapters/archs.py), run on vLLM + transformers
with a training-only case (eager attention: it takes the baseline's rollout scores) and a
rollout-only one (bfloat16: the baseline's training scores), once with side reuse and once
with ``reuse_sides=false``. Every verdict document, token diff and score file is the same
byte for byte; ``xconf verify`` passes both runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.adapters.archs import write_checkpoint
from tests.adapters.conftest import needs_vllm
from tests.adapters.test_arch_matrix import results, run_xconf
from xconf.verify import verify_run

pytestmark = [needs_vllm, pytest.mark.slow]
OVERRIDES = [
    "+experiment=s2_cpu",
    "runtime=vllm_hf",
    "identity.recipe.system_prompt=''",
    "identity.recipe.response_len=6",
    "interventions=[{path: rollout.dtype, values: [bfloat16]},"
    " {path: training.attention_backend, values: [eager]}]",
]
FILES = (
    "comparison.json",
    "token_diffs.safetensors",
    "score_rollout.safetensors",
    "score_training.safetensors",
)


def test_reuse_on_a_transformers_checkpoint_is_bitwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpt = write_checkpoint("llama", tmp_path / "llama")
    runs = {}
    for reuse in ("true", "false"):
        out = tmp_path / f"out-{reuse}"
        argv = [*OVERRIDES, f"runtime.model.path={ckpt}", f"output_root={out}"]
        code = run_xconf([*argv, f"reuse_sides={reuse}"], monkeypatch, tmp_path / "cwd")
        assert code in (0, 1), code
        assert verify_run(out / "s2-cpu").exit_code == 0, reuse
        runs[reuse] = results(out / "s2-cpu")
    reusing, scoring = runs["true"], runs["false"]
    assert set(reusing) == set(scoring) and len(reusing) == 3
    taken = {}
    for label, (result, _, attempt) in reusing.items():
        assert attempt is not None and result in ("pass", "fail"), (label, result)
        other = scoring[label][2]
        assert other is not None
        for name in FILES:
            assert (attempt / name).read_bytes() == (other / name).read_bytes(), (label, name)
        actual = json.loads((attempt / "actual.json").read_text())
        taken[label] = sorted(actual.get("reused_sides", {}))
        assert "reused_sides" not in json.loads((other / "actual.json").read_text())
    assert taken == {
        "baseline": [],
        "rollout.dtype=bfloat16": ["training"],
        "training.attention_backend=eager": ["rollout"],
    }
