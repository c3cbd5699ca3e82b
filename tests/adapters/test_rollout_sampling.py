"""The rollout's logprobs mode and sampling (``rollout.logprobs_mode``, ``rollout.temperature``,
``rollout.top_k``, ``rollout.top_p``) on a checkpoint made with transformers' own Llama classes
(tests/adapters/archs.py), against vLLM's own computation.

Raw logprobs do not move with the temperature (bitwise); processed logprobs are bitwise the
float32 log-softmax of the raw logits rows divided by the temperature (cut to the top-k),
computed here by hand, so the forced frozen token's logprob is the model's, not the forcing's
0; each knob reads back what the engine's sampler used. Through ``xconf-run``, the pairwise
case of ``rollout.temperature`` and ``training.temperature`` shows the mistake verl's users
ask about: against processed logprobs only the two temperatures together pass; against raw
logprobs only the trainer that divides by nothing does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.adapters.archs import random_batch, write_checkpoint
from tests.adapters.conftest import needs_hf, needs_vllm
from xconf.knobs import KnobValueError, canonical

pytestmark = needs_hf


@pytest.mark.parametrize(
    ("path", "raw", "value"),
    [
        ("rollout.temperature", 0, 0.0),
        ("rollout.temperature", 0.7, 0.7),
        ("rollout.top_k", -1, 0),
        ("rollout.top_k", 50.0, 50),
        ("rollout.top_p", 1, 1.0),
        ("rollout.logprobs_mode", "processed", "processed_logprobs"),
        ("rollout.logprobs_mode", "RAW_LOGPROBS", "raw_logprobs"),
    ],
)
def test_values_normalize(path: str, raw: object, value: object) -> None:
    assert canonical(path, raw) == value


@pytest.mark.parametrize(
    ("path", "raw"),
    [
        ("rollout.temperature", -0.1),
        ("rollout.temperature", float("nan")),
        ("rollout.temperature", True),
        ("training.temperature", 0),
        ("rollout.top_k", -2),
        ("rollout.top_k", 1.5),
        ("rollout.top_p", 0.0),
        ("rollout.top_p", 1.01),
        ("rollout.logprobs_mode", "raw_logits"),  # logits, not logprobs: an operator's rows
        ("rollout.logprobs_mode", "processed_logits"),
    ],
)
def test_values_refused(path: str, raw: object) -> None:
    with pytest.raises(KnobValueError):
        canonical(path, raw)


def _request(path: str, value: Any, **knobs: Any) -> Any:
    from xconf.knobs import KNOBS
    from xconf.runtime.protocol import KnobRequest, RuntimeView

    knobs = {k.replace("__", "."): v for k, v in knobs.items()}
    return KnobRequest(
        KNOBS[path], "rollout", value, knobs, RuntimeView("vllm-hf", "cpu", None, "vllm")
    )


@pytest.mark.parametrize(
    ("path", "value", "knobs", "status", "named"),
    [
        ("rollout.logprobs_mode", "raw_logprobs", {}, "applied", "before the temperature"),
        ("rollout.logprobs_mode", "processed_logprobs", {}, "applied", "after the sampler"),
        (
            "rollout.logprobs_mode",
            "processed_logprobs",
            {"logp__backend": "xconf.reference_logp"},
            "unsupported",
            "raw logits rows",
        ),
        (
            "rollout.logprobs_mode",
            "processed_logprobs",
            {"rollout__scoring_mode": "prefill"},
            "unsupported",
            "never processes prompt logprobs",
        ),
        ("rollout.temperature", 0.0, {}, "applied", "greedy"),
        ("rollout.temperature", 1e-6, {}, "unsupported", "greedily"),
        ("rollout.temperature", 0.7, {}, "applied", "do not depend on it"),
        (
            "rollout.temperature",
            0.7,
            {"rollout__logprobs_mode": "processed_logprobs"},
            "applied",
            "log_softmax(logits / 0.7)",
        ),
        ("rollout.top_k", 0, {}, "applied", "every token"),
        ("rollout.top_k", 50, {}, "unsupported", "resets top_k"),
        ("rollout.top_k", 50, {"rollout__temperature": 1.0}, "applied", "do not depend"),
        ("rollout.top_p", 0.9, {"rollout__temperature": 0.0}, "unsupported", "resets top_p"),
        (
            "rollout.top_p",
            0.9,
            {"rollout__temperature": 1.0, "rollout__logprobs_mode": "processed_logprobs"},
            "applied",
            "renormalized",
        ),
    ],
)
def test_each_knob_applies_or_says_why_not(path, value, knobs, status, named) -> None:
    from xconf.adapters.vllm.handlers import HANDLERS

    app = HANDLERS[path].materialize(_request(path, value, **knobs))
    assert app.status == status and named in app.evidence, app


def test_the_reference_scorer_has_no_sampler() -> None:
    from xconf.adapters.hf.handlers import REFERENCE

    for path, fixed, other in (
        ("rollout.logprobs_mode", "raw_logprobs", "processed_logprobs"),
        ("rollout.temperature", 0.0, 0.7),
        ("rollout.top_k", 0, 50),
        ("rollout.top_p", 1.0, 0.9),
    ):
        assert REFERENCE[path].materialize(_request(path, fixed)).status == "applied"
        app = REFERENCE[path].materialize(_request(path, other))
        assert app.status == "unsupported" and "no sampler" in app.evidence


# -- on vLLM: the numbers, against the raw logits rows, and the readback --------------------
SAMPLING = ("rollout.logprobs_mode", "rollout.temperature", "rollout.top_k", "rollout.top_p")


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint("llama", tmp_path_factory.mktemp("sampling") / "llama")


def _batch() -> Any:
    return random_batch(3, ((5, 6), (9, 4), (7, 6)))


def _scored(path: Path, batch: Any, **cfg: Any) -> tuple[Any, Any, Any]:
    """(logprobs [B, T], the rows the engine kept per active token, its live state)."""
    from xconf.adapters.frozen import VocabRows
    from xconf.adapters.vllm.engine import RolloutEngineConfig, VllmRolloutEngine
    from xconf.adapters.vllm.scorer import score_frozen

    rows = VocabRows(batch)
    with VllmRolloutEngine(RolloutEngineConfig(model_path=str(path), **cfg)) as engine:
        logprobs = score_frozen(engine, batch, "decode", 2, vocab_rows=rows)
        live = engine.live()
    return logprobs, rows.active_rows(), live


def _readback(live: Any) -> dict[str, Any]:
    from xconf.adapters.vllm.handlers import HANDLERS
    from xconf.runtime.protocol import knob_readback

    read = knob_readback(HANDLERS, "rollout", live)
    return {k: read[k] for k in SAMPLING}


@needs_vllm
@pytest.mark.slow
def test_processed_logprobs_are_the_model_s_at_the_temperature(llama: Path) -> None:
    import torch

    batch = _batch()
    active = torch.tensor(batch.layout()["active_mask"], dtype=torch.bool)
    targets = torch.tensor(batch.layout()["token_ids"])[:, 1:][active[:, :-1]]
    raw, z, raw_live = _scored(llama, batch)  # today's: greedy, raw logprobs
    assert _readback(raw_live) == {
        "rollout.logprobs_mode": "raw_logprobs",
        "rollout.temperature": 0.0,
        "rollout.top_k": 0,
        "rollout.top_p": 1.0,
    }
    by_hand = z.log_softmax(-1, dtype=torch.float32).gather(1, targets[:, None]).squeeze(1)
    assert torch.equal(raw[active], by_hand)  # the rows are the raw logits of these tokens

    hot_raw, _, live = _scored(llama, batch, temperature=0.7, top_k=50)
    assert torch.equal(hot_raw, raw)  # raw logprobs come before the temperature and top-k
    assert _readback(live)["rollout.temperature"] == 0.7
    assert _readback(live)["rollout.top_k"] == 50

    greedy, _, live = _scored(llama, batch, logprobs_mode="processed_logprobs")
    assert torch.equal(greedy, raw)  # vLLM's greedy path divides by nothing
    assert _readback(live)["rollout.logprobs_mode"] == "processed_logprobs"

    hot, rows, live = _scored(llama, batch, logprobs_mode="processed_logprobs", temperature=0.7)
    t = torch.tensor(0.7, dtype=torch.float32)
    by_hand = (z / t).log_softmax(-1, dtype=torch.float32).gather(1, targets[:, None]).squeeze(1)
    assert torch.equal(hot[active], by_hand)  # the model's, never the forcing's 0
    assert bool((hot[active] < 0).all()) and not torch.equal(hot, raw)
    assert torch.equal(rows.gather(1, targets[:, None]).squeeze(1), by_hand)  # rows kept: these
    assert _readback(live) == {
        "rollout.logprobs_mode": "processed_logprobs",
        "rollout.temperature": 0.7,
        "rollout.top_k": 0,
        "rollout.top_p": 1.0,
    }

    cut, _, live = _scored(
        llama, batch, logprobs_mode="processed_logprobs", temperature=1.0, top_k=50
    )
    kth = z.topk(50, dim=-1).values[:, -1:]
    masked = z.masked_fill(z < kth, float("-inf"))
    by_hand = masked.log_softmax(-1, dtype=torch.float32).gather(1, targets[:, None]).squeeze(1)
    assert torch.equal(cut[active], by_hand)  # renormalized over the top 50 (-inf outside)
    assert _readback(live)["rollout.top_k"] == 50


def test_a_prefill_rollout_refuses_processed_logprobs(llama: Path) -> None:
    pytest.importorskip("vllm")
    from xconf.adapters.errors import UnsupportedKnobError
    from xconf.adapters.vllm.engine import RolloutEngineConfig, VllmRolloutEngine
    from xconf.adapters.vllm.scorer import score_frozen

    cfg = RolloutEngineConfig(model_path=str(llama), logprobs_mode="processed_logprobs")
    with VllmRolloutEngine(cfg) as engine, pytest.raises(UnsupportedKnobError) as info:
        score_frozen(engine, _batch(), "prefill", 2)
    assert info.value.path == "rollout.logprobs_mode"
    assert "never processes prompt logprobs" in info.value.message


# -- through xconf-run: the temperature mistake, as a pairwise case -------------------------
@needs_vllm
@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "passing"),
    [
        # processed logprobs are divided by the rollout's temperature: only the pair passes
        ("processed_logprobs", {"baseline", "pair"}),
        # raw logprobs are never divided: a trainer that divides by 0.7 fails either way
        ("raw_logprobs", {"baseline", "rollout.temperature=0.7"}),
    ],
)
def test_the_trainer_must_divide_as_the_rollout_reports(
    mode: str, passing: set[str], llama: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from tests.adapters.test_arch_matrix import results, run_xconf

    out = tmp_path / "out"
    argv = [
        "+experiment=s2_cpu",
        "runtime=vllm_hf",
        "intervention=temperature",
        "strategy=pairwise",
        "pairwise_paths=[[rollout.temperature,training.temperature]]",
        f"rollout.logprobs_mode={mode}",
        "identity.recipe.system_prompt=''",
        "identity.recipe.response_len=6",
        f"runtime.model.path={llama}",
        f"output_root={out}",
    ]
    run_xconf(argv, monkeypatch, tmp_path / "cwd")
    got = results(out / "s2-cpu")
    pair = "rollout.temperature=0.7,training.temperature=0.7"
    labels = {"baseline", "rollout.temperature=0.7", "training.temperature=0.7", pair}
    assert set(got) == labels, sorted(got)
    shown = {"pair" if k == pair else k: v[0] for k, v in got.items()}
    assert {k for k, v in shown.items() if v == "pass"} == passing, shown
    assert {v for k, v in shown.items() if k not in passing} == {"fail"}, shown
    attempt = got[pair][2]
    assert attempt is not None
    sides = json.loads((attempt / "actual.json").read_text())["sides"]
    read = {(s, a["path"]): (a["status"], a["actual"]) for s in sides for a in sides[s]}
    assert read["rollout", "rollout.logprobs_mode"] == ("applied", mode)
    assert read["rollout", "rollout.temperature"] == ("applied", 0.7)
    assert read["training", "training.temperature"] == ("applied", 0.7)


def test_a_finite_float_reads_back_as_a_knob_value() -> None:
    """A temperature reads back as a float (the merged side readback once dropped every float:
    training.temperature and rollout.temperature were then unobservable in every run)."""
    from xconf.runtime.side import readback_values

    kept = readback_values({"a": 0.7, "b": float("inf"), "c": 1, "d": [1.0]})
    assert kept == {"a": 0.7, "c": 1}


def test_the_sampler_hook_s_decimal_is_numpy_s_per_value_bit_for_bit() -> None:
    """The hook's per-row read of a float32 knob (remembered between steps) is numpy's shortest
    decimal of that float32 for every value, asked twice, -0.0 and 0.0 told apart."""
    import math

    import numpy as np

    from xconf.adapters.vllm.sampling import _decimal

    values = [0.7, 0.70000001, 1.0, 0.0, -0.0, 0.95, 1e-45, 3.4e38, float("inf"), 2.5]
    for value in values + values:
        want = float(np.format_float_positional(np.float32(value), unique=True, trim="0"))
        got = _decimal(value)
        assert got == want and math.copysign(1.0, got) == math.copysign(1.0, want), value
    assert math.isnan(_decimal(float("nan")))
    assert _decimal(0.7) == 0.7 and _decimal(0.7000001) != 0.7
