"""The replacement arms on checkpoints made with transformers' own classes (no engine built).

Each arm replaces the forwards of exactly the modules it claims (counted against numbers
written here from each architecture's layout, not from the code that installs them),
changes no parameter, buffer or module name, leaves the model's modes as they were, and is
read back from the live model. Architectures whose layout the forwards do not know are a
coded ``unsupported`` naming the knob, at bind time and at build time. The decode scoring
shape is bitwise equal to teacher forcing where the kernels are shape-independent: vLLM's
CPU kernels (the full arm), which give a token the same bits whatever else is in the forward
(this test shows it on this machine's ISA, AVX-512; transformers' own sdpa/GEMM path does not:
on the tiny Llama 3 of 24 tokens differ between the two shapes, which no test asserts).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.adapters.archs import write_checkpoint
from tests.adapters.conftest import needs_vllm

pytestmark = needs_vllm

KINDS = ("rms_norm", "linear", "rotary", "attention", "activation", "logits")
SUPPORTED = ("llama", "qwen2", "qwen3", "mistral")
# Modules of each kind in the tiny two-layer checkpoints (tests/adapters/archs.py), counted
# from the architectures: norms (2 per layer, Qwen3 also q/k per layer, 1 final) plus each
# layer's residual adds; 7 linears per layer; one rotary, attention and MLP per layer; 1 head.
EXPECTED = {
    "llama": {"rms_norm": 5 + 2, "linear": 14, "rotary": 2, "attention": 2, "activation": 2},
    "qwen2": {"rms_norm": 5 + 2, "linear": 14, "rotary": 2, "attention": 2, "activation": 2},
    "qwen3": {"rms_norm": 9 + 2, "linear": 14, "rotary": 2, "attention": 2, "activation": 2},
    "mistral": {"rms_norm": 5 + 2, "linear": 14, "rotary": 2, "attention": 2, "activation": 2},
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("arms")
    return {a: write_checkpoint(a, root / a) for a in (*SUPPORTED, "gemma2", "phi3", "gpt2")}


def _batch(responses: tuple[int, ...] = (6, 6, 6, 6)) -> Any:
    import torch

    from xconf.adapters.frozen import FrozenBatch, FrozenSample

    g = torch.Generator().manual_seed(0)
    samples = tuple(
        FrozenSample(
            tuple(torch.randint(3, 300, (n,), generator=g).tolist()),
            tuple(torch.randint(3, 300, (r,), generator=g).tolist()),
        )
        for n, r in zip((5, 9, 7, 12), responses, strict=True)
    )
    return FrozenBatch(samples, 0)


def _scorer(path: Path, align: tuple[str, ...] = (), mode: str = "full", **kw: Any) -> Any:
    from xconf.adapters.hf.model import TrainingScorerConfig
    from xconf.adapters.hf.scorer import HFTrainingScorer

    arms: dict[str, Any] = {f"align_{kind}": "vllm" for kind in align}
    return HFTrainingScorer(
        TrainingScorerConfig(
            model_path=str(path),
            scoring_mode=mode,
            **arms,
            **kw,
        )
    )


def _readback(scorer: Any) -> dict[str, Any]:
    from xconf.adapters.hf.align.handlers import HANDLERS
    from xconf.runtime.protocol import knob_readback

    return knob_readback(HANDLERS, "training", scorer.live())


@pytest.mark.parametrize("arch", SUPPORTED)
@pytest.mark.parametrize("kind", [*KINDS, "all"])
def test_each_arm_replaces_the_modules_it_claims_and_no_weight(
    checkpoints: dict[str, Path], arch: str, kind: str
) -> None:
    from xconf.adapters.hf.readonly import mode_snapshot, state_digest
    from xconf.knobs import TRAINING_ALIGN, TRAINING_ALIGN_ALL

    plain = _scorer(checkpoints[arch])
    kinds = KINDS if kind == "all" else (kind,)
    armed = _scorer(checkpoints[arch], kinds)
    expected = {**EXPECTED[arch], "logits": 1}
    counts = {c.kind: (c.replaced, c.total) for c in armed.live().arms}
    assert counts == {k: (expected[k] if k in kinds else 0, expected[k]) for k in KINDS}
    # No weight, buffer or module changes: the same names, the same tensors, the same bits.
    names = [n for n, _ in plain.model.named_parameters()]
    assert [n for n, _ in armed.model.named_parameters()] == names
    assert [n for n, _ in armed.model.named_modules()] == [
        n for n, _ in plain.model.named_modules()
    ]
    before = state_digest(armed.model)
    assert before == state_digest(plain.model)
    modes = mode_snapshot(armed.model)
    score = armed.score(_batch(), 4)
    assert score.digest_before == score.digest_after == before
    assert score.mode_restored and mode_snapshot(armed.model) == modes
    read = _readback(armed)
    for k in KINDS:
        assert read[TRAINING_ALIGN[k].path] == ("vllm" if k in kinds else "off"), (k, read)
    assert read[TRAINING_ALIGN_ALL.path] == ("vllm" if kind == "all" else "off")


@pytest.mark.parametrize("arch", ["gemma2", "phi3", "gpt2"])
def test_an_architecture_the_arms_do_not_know_is_unsupported_naming_the_knob(
    checkpoints: dict[str, Path], arch: str
) -> None:
    """At build time (the scorer refuses before replacing anything) and at bind time (the
    handler reads the frozen checkpoint's architecture): never silently off."""
    from xconf.adapters.errors import UnsupportedKnobError
    from xconf.adapters.hf.align.handlers import HANDLERS
    from xconf.adapters.models.facts import model_facts
    from xconf.knobs import KNOBS, TRAINING_ALIGN, TRAINING_SCORING_MODE
    from xconf.runtime.protocol import KnobRequest, RuntimeView

    with pytest.raises(UnsupportedKnobError) as info:
        _scorer(checkpoints[arch], ("rotary",))
    assert info.value.code == "arm.unsupported"
    assert info.value.path == TRAINING_ALIGN["rotary"].path
    assert "decoder layout" in info.value.message
    facts = model_facts(str(checkpoints[arch]))
    view = RuntimeView("vllm-hf", "cpu", facts, "vllm")
    for path, value in [
        *((TRAINING_ALIGN[k].path, "vllm") for k in KINDS),
        (TRAINING_SCORING_MODE.path, "decode"),
    ]:
        app = HANDLERS[path].materialize(
            KnobRequest(KNOBS[path], "training", value, _knobs(), view)
        )
        assert app.status == "unsupported" and facts.architecture in app.evidence, (path, app)


def _knobs(**changed: Any) -> dict[str, Any]:
    """The knobs of an s2 baseline case, as a handler receives them."""
    knobs: dict[str, Any] = {
        "rollout.dtype": "float32",
        "training.compute_dtype": "float32",
        "rollout.enforce_eager": True,
        "rollout.tensor_parallel_size": 1,
        "rollout.kv_cache_dtype": "auto",
        "rollout.batch_invariant": False,
        "training.sharding": "unsharded",
    }
    return {**knobs, **{k.replace("__", "."): v for k, v in changed.items()}}


@pytest.mark.parametrize(
    ("kind", "changed", "named"),
    [
        ("rotary", {"rollout__enforce_eager": False}, "enforce_eager=false"),
        ("linear", {"rollout__tensor_parallel_size": 3}, "tensor-parallel over 3 ranks"),
        ("activation", {"rollout__dtype": "bfloat16"}, "rollout runs bfloat16"),
        ("attention", {"rollout__kv_cache_dtype": "fp8"}, "fp8"),
        ("attention", {"rollout__scoring_mode": "prefill"}, "scoring_mode=prefill"),
        ("rms_norm", {"rollout__batch_invariant": True}, "batch-invariant"),
        ("logits", {"training__sharding": "fsdp"}, "FSDP2"),
    ],
)
def test_an_arm_that_cannot_mirror_the_case_s_rollout_is_unsupported(
    checkpoints: dict[str, Path], kind: str, changed: dict[str, Any], named: str
) -> None:
    from xconf.adapters.hf.align.handlers import HANDLERS
    from xconf.adapters.models.facts import model_facts
    from xconf.knobs import KNOBS, TRAINING_ALIGN
    from xconf.runtime.protocol import KnobRequest, RuntimeView

    view = RuntimeView("vllm-hf", "cpu", model_facts(str(checkpoints["llama"])), "vllm")
    spec = KNOBS[TRAINING_ALIGN[kind].path]
    ok = HANDLERS[spec.path].materialize(KnobRequest(spec, "training", "vllm", _knobs(), view))
    assert ok.status == "applied" and ok.materialized == "vllm"
    app = HANDLERS[spec.path].materialize(
        KnobRequest(spec, "training", "vllm", _knobs(**changed), view)
    )
    assert app.status == "unsupported" and named in app.evidence, app


def test_the_full_arm_materializes_every_kind_and_hf_pair_has_none(
    checkpoints: dict[str, Path],
) -> None:
    from xconf.adapters.hf.align.handlers import HANDLERS
    from xconf.adapters.models.facts import model_facts
    from xconf.knobs import KNOBS, TRAINING_ALIGN, TRAINING_ALIGN_ALL
    from xconf.runtime.protocol import KnobRequest, RuntimeView

    facts = model_facts(str(checkpoints["qwen3"]))
    view = RuntimeView("vllm-hf", "cpu", facts, "vllm")
    knobs = _knobs(training__align__all="vllm")
    for kind in KINDS:
        spec = KNOBS[TRAINING_ALIGN[kind].path]
        app = HANDLERS[spec.path].materialize(KnobRequest(spec, "training", "off", knobs, view))
        assert (app.status, app.requested, app.materialized) == ("applied", "off", "vllm")
        assert TRAINING_ALIGN_ALL.path in app.evidence
        # hf_pair: the same training side, its rollout the transformers reference scorer
        pair = HANDLERS[spec.path].materialize(
            KnobRequest(
                spec, "training", "vllm", _knobs(), RuntimeView("hf-pair", "cpu", facts, "hf")
            )
        )
        assert pair.status == "unsupported" and "reference scorer" in pair.evidence


@pytest.mark.parametrize("arch", SUPPORTED)
@pytest.mark.parametrize("responses", [(6, 6, 6, 6), (6, 2, 4, 6)])
def test_decode_shaped_scoring_equals_teacher_forcing_with_shape_independent_kernels(
    checkpoints: dict[str, Path], arch: str, responses: tuple[int, ...]
) -> None:
    """Under the full arm every token gets the same bits whether it is scored in one
    teacher-forced forward (padded or packed), in the rollout engine's decode steps (prefill
    padded or packed) or in requests of one sample: the decode mode's bookkeeping (KV caches,
    positions, the rows it scores) loses nothing. Relies on vLLM's CPU kernels computing a row
    the same way whatever the number of rows (true of this machine's AVX-512 build). Responses
    of different lengths leave the decode batch as they end, as finished requests do."""
    import torch

    batch = _batch(responses)
    active = torch.tensor(batch.layout()["active_mask"], dtype=torch.bool)
    path = checkpoints[arch]
    full = _scorer(path, KINDS).score(batch, 4).logprobs
    for mode, packed, size in (
        ("decode", False, 4),
        ("decode", True, 4),
        ("full", True, 4),
        ("full", False, 1),
    ):
        other = _scorer(path, KINDS, mode, remove_padding=packed).score(batch, size).logprobs
        assert torch.equal(full[active], other[active]), (arch, mode, packed, size)


def test_a_full_forward_attends_in_the_rollout_s_decode_steps() -> None:
    """The attention arm in a teacher-forced forward gives every token the bits of vLLM's
    decode step that computed it: SmolLM2's heads (9 query, 3 KV, head size 64), the prompt
    lengths of make run's second request (143, 149, 150, 146 tokens) and 96 response tokens,
    random keys and values. vLLM's CPU scheduler splits a decode query's keys across threads
    by the step's requests and lengths (``VLLM_CPU_ATTN_SPLIT_KV``), so two threads here (as
    the run's): on the AVX-512 machine of docs/arms.md one prefill of the whole sequences
    gives 12 of the third request's rows other bits (not asserted: it depends on the CPU; on
    one thread there is nothing to split and one prefill gives the decode steps' bits)."""
    import torch

    from xconf.adapters.hf.align.kernels import PagedAttention

    heads, kv_heads, dim, scale = 9, 3, 64, 0.125
    prompts, responses = [143, 149, 150, 146], [96, 96, 96, 96]
    lengths = [p + r for p, r in zip(prompts, responses, strict=True)]
    g = torch.Generator().manual_seed(0)
    q, k, v = (
        [torch.randn(n, h, dim, generator=g) for n in lengths] for h in (heads, kv_heads, kv_heads)
    )
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        steps = PagedAttention(1, heads, kv_heads, dim, lengths, torch.float32)
        steps.begin_rollout_steps(prompts, responses, [0, 1, 2, 3])
        forward = steps(0, torch.cat(q), torch.cat(k), torch.cat(v), scale).split(lengths)
        decode = PagedAttention(1, heads, kv_heads, dim, lengths, torch.float32)
        decode.begin_step(prompts, [0, 1, 2, 3])
        cut = [(x[:p], y[:p], z[:p]) for x, y, z, p in zip(q, k, v, prompts, strict=True)]
        pq, pk, pv = (torch.cat([c[t] for c in cut]) for t in range(3))
        rows = [[o] for o in decode(0, pq, pk, pv, scale).split(prompts)]
        for j in range(1, 96):  # decode step j: the token at prompt + j - 1 of each request
            decode.begin_step([1] * 4, [0, 1, 2, 3])
            at = [p + j - 1 for p in prompts]
            sq, sk, sv = (
                torch.stack([x[i] for x, i in zip(t, at, strict=True)]) for t in (q, k, v)
            )
            out = decode(0, sq, sk, sv, scale)
            for r in range(4):
                rows[r].append(out[r : r + 1])
    finally:
        torch.set_num_threads(before)
    for r in range(4):  # every row the rollout computed (all but each request's last token)
        assert torch.equal(forward[r][:-1], torch.cat(rows[r])), r


def test_decode_mode_reads_back_its_steps_and_kv_cache(checkpoints: dict[str, Path]) -> None:
    from xconf.knobs import TRAINING_SCORING_MODE
    from xconf.runtime.readback import TRAINING_FORWARD_TOKENS

    scorer = _scorer(checkpoints["llama"], (), "decode", remove_padding=True)
    assert scorer.uses_kv_cache
    scorer.score(_batch(), 4)
    live = scorer.live()
    assert _readback(scorer)[TRAINING_SCORING_MODE.path] == "decode"
    # one prefill of the four prompts (5 + 9 + 7 + 12 tokens), then 5 steps of 4 tokens
    assert live.readings()[TRAINING_FORWARD_TOKENS.name] == "33+5x4"
    scorer.score(_batch((6, 2, 4, 6)), 4)  # samples leave the batch as their responses end
    assert scorer.live().readings()[TRAINING_FORWARD_TOKENS.name] == "33+4+2x3+2x2"
    full = _scorer(checkpoints["llama"])
    full.score(_batch(), 4)
    assert not full.uses_kv_cache and _readback(full)[TRAINING_SCORING_MODE.path] == "full"


def test_an_installed_forward_outside_the_scorer_is_refused(checkpoints: dict[str, Path]) -> None:
    import torch

    from xconf.adapters.errors import ScoringError

    scorer = _scorer(checkpoints["llama"], ("rotary",))
    with pytest.raises(ScoringError) as info:
        scorer.model(input_ids=torch.tensor([[5, 6, 7]]))
    assert info.value.code == "arm.outside_scorer"


@pytest.mark.parametrize("arch", ["gemma2", "phi3", "gpt2"])
def test_a_layout_the_arms_do_not_know_still_reads_back(
    checkpoints: dict[str, Path], arch: str
) -> None:
    """Its scorer (no arm can be installed) reports its knobs as before, and every arm reads
    ``off`` from the live model (no module's forward replaced, none the arms could replace):
    a baseline declaring the arms ``off`` is observed, not refused as unobservable."""
    from xconf.knobs import TRAINING_ALIGN, TRAINING_COMPUTE_DTYPE, TRAINING_SCORING_MODE

    scorer = _scorer(checkpoints[arch])
    scorer.score(_batch(), 4)
    read = _readback(scorer)
    assert read[TRAINING_SCORING_MODE.path] == "full"
    assert {read[TRAINING_ALIGN[k].path] for k in KINDS} == {"off"}
    assert read["training.align.all"] == "off"
    counts = {(c.kind, c.replaced, c.total) for c in scorer.live().arms}
    assert counts == {(k, 0, 0) for k in KINDS} and not scorer.live().decode_ready
    from xconf.adapters.hf.handlers import TRAINING
    from xconf.runtime.protocol import knob_readback

    assert knob_readback(TRAINING, "training", scorer.live())[TRAINING_COMPUTE_DTYPE.path] == (
        "float32"
    )
