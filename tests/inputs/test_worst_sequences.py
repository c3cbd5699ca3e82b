"""The per-sequence view: the worst sequences by sequence log-ratio and by mismatches, in
the HTML report and its JSON, with the response text when the dump carries token ids."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from tests.adapters.conftest import HAVE_HF

B, T = 5, 6


def _dump(path: Path) -> Path:
    rollout = -torch.arange(1, B * T + 1, dtype=torch.float32).reshape(B, T) / 10
    drift = torch.zeros((B, T))
    drift[0, :] = 1e-6  # a little everywhere, no mismatch
    drift[1, 2] = 0.5  # one big token: the largest sequence log-ratio, one mismatch
    drift[2, :4] = -2e-3  # four mismatches, a small (negative) log-ratio
    drift[3, 1] = 3e-3  # one small mismatch
    mask = torch.ones((B, T), dtype=torch.int64)
    mask[4] = 0  # a fully masked row: never a "worst" sequence
    mask[2, 5] = 0
    responses = torch.arange(B * T).reshape(B, T) + 10
    save_file(
        {
            "rollout_log_probs": rollout,
            "old_log_probs": rollout + drift,
            "response_mask": mask,
            "responses": responses,
        },
        str(path),
        metadata={"dtype": "float32"},
    )
    return path


def _tokenizer(root: Path) -> Path:
    """A real `tokenizers` word-level tokenizer: token id i is the word ``w<i>``."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    root.mkdir()
    vocab = {f"w{i}": i for i in range(64)} | {"[UNK]": 64}
    Tokenizer(WordLevel(vocab, unk_token="[UNK]")).save(str(root / "tokenizer.json"))
    return root


@pytest.mark.skipif(not HAVE_HF, reason="tokenizers is not installed")
def test_worst_sequences_in_report_json_and_html(xconf_cli: Any, tmp_path: Path) -> None:
    dump = _dump(tmp_path / "step.safetensors")
    code, _, err = xconf_cli("judge", dump, "--output-root", tmp_path / "out")
    assert code == 1, err
    run = tmp_path / "out" / "judge"
    tok = _tokenizer(tmp_path / "tok")
    out = tmp_path / "report.json"
    assert xconf_cli("report", run, "-o", out, "--tokenizer", tok, "--quiet")[0] == 0
    (case,) = json.loads(out.read_text())["cases"]
    by_ratio = case["worst_sequences_by_log_ratio"]
    assert [s["batch"] for s in by_ratio] == [1, 2, 3, 0]  # row 4 has no active token
    assert by_ratio[0]["log_ratio"] == pytest.approx(0.5, rel=1e-5)
    assert by_ratio[1]["log_ratio"] == pytest.approx(-8e-3, rel=1e-3)
    assert by_ratio[1]["mean_log_ratio"] == pytest.approx(-8e-3 / 5, rel=1e-3)
    assert (by_ratio[1]["active"], by_ratio[1]["mismatches"]) == (5, 4)
    by_mismatches = case["worst_sequences_by_mismatches"]
    assert [(s["batch"], s["mismatches"]) for s in by_mismatches] == [(2, 4), (1, 1), (3, 1)]
    # Token text from the dump's own ids: row 2 is ids 22..26 (its last token is masked out).
    assert by_mismatches[0]["text"] == "w22w23w24w25w26"
    html_out = tmp_path / "report.html"
    assert xconf_cli("report", run, "-o", html_out, "--tokenizer", tok, "--quiet")[0] == 0
    html = html_out.read_text()
    assert 'class="worst-sequences" data-order="log_ratio"' in html
    assert 'data-order="mismatches"' in html and "w22w23w24w25w26" in html
    # Without a tokenizer the sequences are still ranked, with no text.
    assert xconf_cli("report", run, "-o", out, "--quiet")[0] == 0
    (bare,) = json.loads(out.read_text())["cases"]
    assert [s["batch"] for s in bare["worst_sequences_by_log_ratio"]] == [1, 2, 3, 0]
    assert all(s["text"] is None for s in bare["worst_sequences_by_mismatches"])
