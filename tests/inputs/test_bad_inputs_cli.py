"""Every bad checkpoint / prompt input of the issue through `xconf-run`'s own `main()`:
exit 2, the code, the file and row named, and nothing written (no output root, checkpoint
untouched). In-process: none of them builds an engine (the inputs are checked first).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.commands import refused_in_process
from tests.conftest import snapshot
from tests.inputs.datasets import write_jsonl, write_verl_parquet


def _cases(checkpoints: dict[str, Path], root: Path) -> list[tuple[str, list[str], str, str]]:
    pickles = root / "pickles"
    pickles.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(checkpoints["qwen3"] / name, pickles)
    (pickles / "pytorch_model.bin").write_bytes(b"\x80\x04 never opened")
    no_template = root / "no_template"
    shutil.copytree(checkpoints["qwen3"], no_template)
    cfg = json.loads((no_template / "tokenizer_config.json").read_text())
    cfg.pop("chat_template")
    (no_template / "tokenizer_config.json").write_text(json.dumps(cfg))
    verl = write_verl_parquet(root / "verl.parquet")
    no_prompt = write_jsonl(root / "rows.jsonl", [{"prompt": "fine"}, {"data_source": "x"}])
    model = "runtime.model.path="
    data = "identity.recipe.dataset.path="
    return [
        ("missing_dir", [f"{model}{root / 'absent'}"], "model.missing_dir", "absent"),
        ("pickles", [f"{model}{pickles}"], "model.pickle_weights", "safetensors"),
        (
            "no_template",
            [f"{model}{no_template}", f"{data}{verl}"],
            "dataset.no_chat_template",
            f"{verl}:row 0",
        ),
        (
            "no_prompt",
            [f"{model}{checkpoints['qwen3']}", f"{data}{no_prompt}"],
            "dataset.no_prompt",
            f"{no_prompt}:row 1",
        ),
        (
            "unknown_option",
            ["+runtime.model_path=/x"],
            "runtime.unknown_option",
            "runtime.model_path",
        ),
    ]


def test_bad_inputs_exit_2_with_their_code_and_write_nothing(
    checkpoints: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    cases = _cases(checkpoints, inputs)
    before = snapshot(inputs) | snapshot(checkpoints["qwen3"])
    for name, overrides, code, named in cases:
        cwd = tmp_path / f"cwd-{name}"
        cwd.mkdir()
        monkeypatch.chdir(cwd)
        out = tmp_path / f"out-{name}"
        argv = ["+experiment=s2_cpu", "runtime=vllm_hf", *overrides, f"output_root={out}"]
        refused_in_process(monkeypatch, capsys, argv, code, named, name)
        assert not out.exists(), name  # no plan, no attempt (Hydra's cwd/outputs is Hydra's)
        assert snapshot(inputs) | snapshot(checkpoints["qwen3"]) == before, name
