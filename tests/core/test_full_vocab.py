"""The full-vocabulary figures (``xconf/full_vocab.py``) against an independent numpy
float64 referee (``tests/full_vocab_reference.py``), and that they never vote."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests import full_vocab_reference as referee
from tests.core.test_comparison import ACTIVE, base_logprobs, judge, score
from xconf.full_vocab import FIGURES, full_vocab_figures, position_figures, summarize

ROWS = int(ACTIVE.sum())


def _rows(seed: int, n: int = ROWS, vocab: int = 64, scale: float = 3.0) -> torch.Tensor:
    return torch.randn(n, vocab, generator=torch.Generator().manual_seed(seed)) * scale


def test_position_figures_agree_with_the_numpy_referee() -> None:
    r = _rows(1, n=300)  # more than one float64 block
    t = r + 0.05 * _rows(2, n=300)
    r[3, :10] = -torch.inf  # a masked part of the vocabulary on one side only
    ours = position_figures(r, t)
    theirs = referee.figures(r.numpy(), t.numpy())
    assert set(ours) == set(FIGURES) == set(theirs)
    for name in FIGURES:
        np.testing.assert_allclose(ours[name].numpy(), theirs[name], rtol=1e-12, atol=1e-15)
    assert float(ours["kl_rollout_training"].min()) >= 0.0


def test_ties_at_the_kth_value_go_to_the_lowest_token_id() -> None:
    # bfloat16 rows hold exact ties: the top-k set must not depend on topk's tie order.
    r = torch.round(_rows(8, n=64, vocab=200) * 2) / 2  # many ties
    t = torch.round(_rows(9, n=64, vocab=200) * 2) / 2
    ours = position_figures(r, t)
    theirs = referee.figures(r.numpy(), t.numpy())
    for name in ("top1_overlap", "top10_overlap", "argmax_agrees"):
        np.testing.assert_array_equal(ours[name].numpy(), theirs[name])


def test_summary_per_sequence_and_per_case() -> None:
    r, t = _rows(3), _rows(4)
    section = summarize(position_figures(r, t), ACTIVE)
    theirs = referee.figures(r.numpy(), t.numpy())
    expected = referee.per_sequence(theirs, ACTIVE.numpy())
    assert [s["batch"] for s in section["sequences"]] == [0, 1]
    for seq, want in zip(section["sequences"], expected, strict=True):
        for name, value in want.items():
            assert seq["mean"][name] == pytest.approx(value, rel=1e-12, abs=1e-15)
    assert section["case"]["positions"] == ROWS
    assert section["case"]["max"]["total_variation"] == pytest.approx(
        float(theirs["total_variation"].max()), rel=1e-12
    )


def test_identical_rows_have_zero_divergence_and_full_overlap() -> None:
    r = _rows(5)
    case = summarize(position_figures(r, r.clone()), ACTIVE)["case"]["mean"]
    assert case["kl_rollout_training"] == case["kl_training_rollout"] == 0.0
    assert case["total_variation"] == 0.0
    assert case["top1_overlap"] == case["top10_overlap"] == case["argmax_agrees"] == 1.0


@pytest.mark.parametrize(
    ("rollout", "training", "needle"),
    [
        (None, _rows(1), "rollout side"),
        (_rows(1), None, "training side"),
        (_rows(1, n=ROWS + 1), _rows(2, n=ROWS + 1), "active positions"),
        (_rows(1), _rows(2, vocab=65), "not one [positions, vocab] layout"),
    ],
)
def test_missing_or_mismatched_rows_are_said_never_guessed(rollout, training, needle) -> None:
    section = full_vocab_figures(rollout, training, ACTIVE)
    assert section["available"] is False and needle in section["reason"], section


def test_the_figures_never_vote() -> None:
    # Same selected-token scores, very different distributions: still a pass.
    lp = base_logprobs()
    out = judge(score(lp, vocab_rows=_rows(6)), score(lp.clone(), vocab_rows=_rows(7)))
    assert out.result == "pass"
    vocab = out.document["full_vocab"]
    assert vocab["available"] and vocab["case"]["mean"]["kl_rollout_training"] > 0.1
    # And no rows: the verdict document says the figures are missing, and why.
    plain = judge(score(lp), score(lp.clone()))
    assert plain.result == "pass" and plain.document["full_vocab"]["available"] is False


def test_vocab_rows_hand_over_the_active_rows_row_major_or_none() -> None:
    from xconf.adapters.frozen import FrozenBatch, FrozenSample, VocabRows

    batch = FrozenBatch((FrozenSample((1, 2), (3, 4)), FrozenSample((5,), (6, 7, 8))), 0)
    # active positions: sample 0 -> 1, 2; sample 1 -> 0, 1, 2 (row-major)
    rows = VocabRows(batch)
    table = torch.arange(5 * 4, dtype=torch.float32).reshape(5, 4)
    rows.keep(1, [2, 0, 1], table[[4, 2, 3]])  # out of order, as a chunked request may
    rows.keep(0, [0, 1, 2], torch.cat([torch.full((1, 4), -1.0), table[:2]]))  # 0: a prompt row
    assert torch.equal(rows.active_rows(), table)
    partial = VocabRows(batch)
    partial.keep(0, [1, 2], table[:2])
    assert partial.active_rows() is None  # sample 1 kept nothing: no rows, never a guess


def _whole_row_rule(r: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
    """The overlaps and argmax agreement by whole-row masks (the rule every row once took)."""
    from xconf.full_vocab import TOP_K, _members

    out = {}
    for top in TOP_K:
        k = min(top, r.shape[-1])
        shared = (_members(r, k) & _members(t, k)).sum(-1)
        out[f"top{top}_overlap"] = shared.to(torch.float64) / k
    out["argmax_agrees"] = (r.argmax(-1) == t.argmax(-1)).to(torch.float64)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_top_figures_are_the_whole_row_rule_bit_for_bit(dtype) -> None:
    # Clear rows are counted from topk ids, the rest (ties at the k-th value, NaN, +-inf)
    # from whole-row masks: every row must read what the masks alone give.
    r = _rows(10, n=300, vocab=300).to(dtype)
    t = (r.float() + 0.3 * _rows(11, n=300, vocab=300)).to(dtype)
    coarse = torch.round(_rows(12, n=300, vocab=300)).to(dtype)  # ties everywhere
    r[::3], t[1::3] = coarse[::3], coarse[1::3]
    r[5, 7], t[6, :4] = torch.nan, torch.nan  # NaN sorts first in topk, argmax picks it
    r[8, :20], t[9] = torch.inf, -torch.inf
    r[10, 1], t[10, 2] = torch.inf, torch.inf
    r[11], t[11] = torch.nan, torch.nan
    r[12, 3], t[12, 3] = 50.0, 50.0  # one clear maximum on both sides, same token
    ours = position_figures(r, t)
    want = _whole_row_rule(r, t)
    for name, values in want.items():
        assert torch.equal(ours[name], values), name
    assert 0.0 < float(ours["top10_overlap"].mean()) < 1.0  # both kinds of row are in play
    assert bool((ours["argmax_agrees"] == 0).any()) and bool((ours["argmax_agrees"] == 1).any())


def test_a_vocabulary_smaller_than_the_top_k_takes_the_whole_row_rule() -> None:
    r, t = _rows(13, n=20, vocab=6), _rows(14, n=20, vocab=6)
    ours = position_figures(r, t)
    want = _whole_row_rule(r, t)  # k = 10 is clipped to the 6 tokens there are
    for name, values in want.items():
        assert torch.equal(ours[name], values), name


def test_blocks_on_parallel_threads_give_the_serial_figures_bit_for_bit(monkeypatch) -> None:
    import xconf.full_vocab as fv

    r = _rows(15, n=3 * fv.BLOCK_ROWS + 5, vocab=512)
    t = r + 0.1 * _rows(16, n=3 * fv.BLOCK_ROWS + 5, vocab=512)
    monkeypatch.setattr(fv, "MAX_WORKERS", 1)
    serial = position_figures(r, t)
    monkeypatch.setattr(fv, "MAX_WORKERS", 4)
    monkeypatch.setattr(fv, "_workers", lambda: 4)  # threads even on a one-CPU machine
    threaded = position_figures(r, t)
    for name in FIGURES:
        assert torch.equal(serial[name], threaded[name]), name
