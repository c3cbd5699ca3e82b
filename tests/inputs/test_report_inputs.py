"""Report additions: csv rows, each case's own threshold, zero drift on the floor, token text."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

import torch
from safetensors.torch import save_file


def _judged(xconf_cli, tmp_path: Path) -> Path:
    r = torch.tensor([[-1.0, -2.0, -0.5], [-0.25, -1.5, -2.5]])
    t = r.clone()
    t[0, 1] += 1e-3  # fails float32 (1e-5), passes bfloat16 (5e-2)
    t[1, 2] += 0.2  # fails both
    tensors = {
        "rollout_log_probs": r,
        "old_log_probs": t,
        "response_mask": torch.ones(2, 3),
        "responses": torch.tensor([[40, 41, 42], [50, 51, 52]]),
    }
    save_file(tensors, str(tmp_path / "fp32.safetensors"), metadata={"dtype": "float32"})
    save_file(tensors, str(tmp_path / "bf16.safetensors"), metadata={"dtype": "bfloat16"})
    argv = ["judge", tmp_path / "bf16.safetensors", tmp_path / "fp32.safetensors"]
    assert xconf_cli(*argv, "--output-root", tmp_path / "out")[0] == 1
    return tmp_path / "out" / "judge"


def test_csv_has_one_row_per_case_with_wall_time(xconf_cli, tmp_path: Path) -> None:
    run = _judged(xconf_cli, tmp_path)
    code, out, err = xconf_cli("report", run, "--format", "csv", "-o", "-")
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    assert sorted(r["case_id"] for r in rows) == ["bf16", "fp32"]
    by = {r["case_id"]: r for r in rows}
    assert (by["bf16"]["mismatches"], by["fp32"]["mismatches"]) == ("1", "2")
    assert float(by["fp32"]["threshold"]) == 1e-5 and float(by["bf16"]["threshold"]) == 0.05
    assert all(float(r["wall_s"]) >= 0 for r in rows)
    assert float(by["bf16"]["rc_kl"]) < 0  # rollout below training on average


def test_attribution_rows_carry_each_cases_threshold(xconf_cli, tmp_path: Path) -> None:
    from xconf.report.build import build_report
    from xconf.report.plots import attribution_figure

    data = build_report(_judged(xconf_cli, tmp_path))
    thresholds = {row.case_id: row.threshold for row in data.attribution}
    assert thresholds == {"bf16": 0.05, "fp32": 1e-5}
    image = attribution_figure(data.attribution, None)
    assert image is not None and "own threshold" in image.alt


def test_profile_zero_sits_on_the_floor() -> None:
    from xconf.report.case_plots import _floored

    assert _floored(0.0, 1e-9) == 1e-9
    assert _floored(3e-3, 1e-9) == 3e-3
    assert math.isnan(_floored(None, 1e-9))


def test_sequences_as_text_with_a_tokenizer(
    xconf_cli, tmp_path: Path, checkpoints: dict[str, Path]
) -> None:
    from tokenizers import Tokenizer

    from xconf.report.build import build_report

    run = _judged(xconf_cli, tmp_path)
    tok = Tokenizer.from_file(str(checkpoints["qwen3"] / "tokenizer.json"))
    data = build_report(run, tokenizer=checkpoints["qwen3"])
    case = next(c for c in data.cases if c.case_id == "bf16")
    assert [s.batch for s in case.sequences] == [0, 1]
    texts = [t for t, _, _ in case.sequences[1].tokens]
    assert texts == [tok.decode([i]) for i in (50, 51, 52)]
    assert [bad for _, _, bad in case.sequences[1].tokens] == [False, False, True]
    code, _, err = xconf_cli("report", run, "--tokenizer", checkpoints["qwen3"], "--quiet")
    assert code == 0, err
    html = (run / "report.html").read_text()
    assert 'class="tok tok-over"' in html and "wall time" in html and "rollout_corr" in html
