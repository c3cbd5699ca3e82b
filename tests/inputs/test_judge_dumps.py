"""`xconf judge` on dumps that try to lie: replaced mid-read, p > 1, float64, ragged, huge."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.conftest import snapshot

R = torch.tensor([[-1.0, -2.0, -0.5, -3.0], [-0.25, -1.5, -2.5, -0.1]])


def _save(path: Path, rollout: torch.Tensor, training: torch.Tensor, **extra: Any) -> Path:
    mask = extra.pop("mask", torch.ones(rollout.shape, dtype=torch.int64))
    save_file(
        {"rollout_log_probs": rollout, "old_log_probs": training, "response_mask": mask, **extra},
        str(path),
        metadata={"dtype": "float32"},
    )
    return path


def _attempt(run: Path, case: str) -> Path:
    (attempt,) = sorted((run / "cases" / case).iterdir())
    return attempt


def _doc(run: Path, case: str, name: str = "comparison.json") -> dict[str, Any]:
    return json.loads((_attempt(run, case) / name).read_text())  # type: ignore[no-any-return]


class _ReplaceOnOpen:
    """An audit hook that renames ``replacement`` over ``target`` the first time anything in
    this process opens ``target`` (audit hooks cannot be removed: it disarms itself)."""

    def __init__(self, target: Path, replacement: Path) -> None:
        self.target, self.replacement, self.armed = str(target), replacement, True

    def __call__(self, event: str, args: tuple[Any, ...]) -> None:
        opened = args[0] if event == "open" and args else None
        if (
            self.armed
            and isinstance(opened, str | os.PathLike)
            and os.fspath(opened) == self.target
        ):
            self.armed = False
            os.replace(self.replacement, self.target)


def test_a_dump_replaced_while_judged_seals_the_verdict_of_the_digested_bytes(
    xconf_cli, tmp_path: Path
) -> None:
    dump = _save(tmp_path / "step.safetensors", R, R.clone())  # passes
    failing = _save(tmp_path / "other.safetensors", R, R - 1e-3)  # fails
    digests = {
        hashlib.sha256(p.read_bytes()).hexdigest(): verdict
        for p, verdict in ((dump, "pass"), (failing, "fail"))
    }
    hook = _ReplaceOnOpen(dump, failing)
    sys.addaudithook(hook)
    try:
        code, _, err = xconf_cli("judge", dump, "--output-root", tmp_path / "out")
    finally:
        hook.armed = False
    assert not hook.armed, "the dump was never opened from Python: the test proves nothing"
    run = tmp_path / "out" / "judge"
    sealed = _doc(run, "step", "actual.json")["dump"]["sha256"]
    assert _doc(run, "step")["result"] == digests[sealed], "a verdict under another file's digest"
    assert code == (0 if digests[sealed] == "pass" else 1), err
    # Judging the file now at the path again agrees (reused or not, same verdict).
    code, _, _ = xconf_cli("judge", dump, "--output-root", tmp_path / "out")
    assert code == 1


def test_positive_log_probabilities_are_invalid_artifacts(xconf_cli, tmp_path: Path) -> None:
    hostile = _save(tmp_path / "plus.safetensors", R + 7.5 - R, R + 7.5 - R)  # +7.5, p ~ 1808
    code, _, err = xconf_cli("judge", hostile, "--output-root", tmp_path / "a")
    assert code == 1, err
    doc = _doc(tmp_path / "a" / "judge", "plus")
    assert doc["result"] == "invalid_artifact" and "above 0" in doc["reason"]
    assert xconf_cli("verify", tmp_path / "a" / "judge")[0] == 0
    # Above 0 by rounding only (well under the float32 threshold) is still judged.
    rounding = R.clone()
    rounding[0, 0] = 1e-7
    near = _save(tmp_path / "near.safetensors", rounding, rounding.clone())
    code, _, err = xconf_cli("judge", near, "--output-root", tmp_path / "b")
    assert code == 0, err


@pytest.mark.parametrize(("delta", "result"), [(1.04e-5, "fail"), (0.96e-5, "pass")])
def test_float64_dumps_are_judged_in_float64(
    xconf_cli, tmp_path: Path, delta: float, result: str
) -> None:
    rollout = torch.full((1, 4), -30.0, dtype=torch.float64)
    training = rollout.clone()
    training[0, 2] -= delta  # cast to float32 this is 9.54e-6: a float32 judge passes both
    assert abs(float(training[0, 2].float()) - -30.0) < 1e-5
    path = _save(tmp_path / "f64.safetensors", rollout, training)
    code, _, err = xconf_cli("judge", path, "--output-root", tmp_path / "out")
    run = tmp_path / "out" / "judge"
    doc = _doc(run, "f64")
    assert doc["result"] == result and code == (1 if result == "fail" else 0), err
    assert _doc(run, "f64", "actual.json")["dump"]["verdict_dtype"] == "float64"
    diffs = load_file(str(_attempt(run, "f64") / "token_diffs.safetensors"))
    assert diffs["rollout_logprobs"].dtype == diffs["threshold"].dtype == torch.float64
    assert float(diffs["abs_diff"][0, 2]) == pytest.approx(delta, rel=1e-9)
    assert xconf_cli("verify", run)[0] == 0
    assert doc["rollout_correction"]["dtype"] == "float64"


def _ragged_rows() -> tuple[list[list[float]], list[list[float]]]:
    rollout = [[-1.0, -2.0, -0.5], [-0.25], [-1.5, -2.5, -0.1, -3.0, -0.7]]
    training = [[v - (2e-3 if i == 1 else 0.0) for i, v in enumerate(row)] for row in rollout]
    return rollout, training


def _padded(rows: list[list[float]]) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([r + [0.0] * (width - len(r)) for r in rows], dtype=torch.float32)


def test_ragged_parquet_and_jsonl_rows_build_the_mask_from_their_lengths(
    xconf_cli, tmp_path: Path
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rollout, training = _ragged_rows()
    f32 = pa.list_(pa.float32())
    parquet = tmp_path / "ragged.parquet"
    pq.write_table(
        pa.table(
            {
                "rollout_log_probs": pa.array(rollout, type=f32),
                "old_log_probs": pa.array(training, type=f32),
                "dtype": ["float32"] * 3,
            }
        ),
        parquet,
    )
    jsonl = tmp_path / "ragged.jsonl"
    lines = [
        {"uid": f"u\u2028{i}", "rollout_log_probs": r, "old_log_probs": t, "dtype": "float32"}
        for i, (r, t) in enumerate(zip(rollout, training, strict=True))
    ]
    jsonl.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines))
    lengths = torch.tensor([3, 1, 5])
    mask = (torch.arange(5)[None] < lengths[:, None]).to(torch.int64)
    padded = _save(tmp_path / "padded.safetensors", _padded(rollout), _padded(training), mask=mask)
    out = tmp_path / "out"
    code, _, err = xconf_cli(
        "judge", "--case", f"pq={parquet}", "--case", f"jl={jsonl}", "--case", f"st={padded}",
        "--output-root", out,
    )  # fmt: skip
    assert code == 1, err
    run = out / "judge"
    docs = {case: _doc(run, case) for case in ("pq", "jl", "st")}
    for doc in docs.values():
        assert (doc["result"], doc["active_tokens"], doc["mismatches"]) == ("fail", 9, 2)
    assert (
        docs["pq"]["rollout_correction"]["metrics"] == docs["st"]["rollout_correction"]["metrics"]
    )
    assert _doc(run, "jl", "actual.json")["dump"]["verdict_dtype"] == "float64"  # JSON numbers
    assert _doc(run, "pq", "actual.json")["dump"]["ragged"] is True
    assert xconf_cli("verify", run)[0] == 0


def _bad(tmp_path: Path) -> list[tuple[Path, str]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rollout, training = _ragged_rows()
    wrong = tmp_path / "wrong_lengths.parquet"
    pq.write_table(
        pa.table(
            {
                "rollout_log_probs": rollout,
                "old_log_probs": training,
                "response_mask": [[1] * (len(r) + 1) for r in rollout],
            }
        ),
        wrong,
    )
    skew = tmp_path / "skew.parquet"
    pq.write_table(
        pa.table({"rollout_log_probs": rollout, "old_log_probs": [r[:1] for r in training]}), skew
    )
    good = _save(tmp_path / "good.safetensors", R, R.clone())
    data = good.read_bytes()
    past = tmp_path / "header_past.safetensors"
    past.write_bytes(struct.pack("<Q", len(data)) + data[8:])
    (length,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8 : 8 + length])
    header["rollout_log_probs"]["data_offsets"][1] += 4  # claims more bytes than its shape
    text = json.dumps(header).encode()
    lying = tmp_path / "offsets.safetensors"
    lying.write_bytes(struct.pack("<Q", len(text)) + text + data[8 + length :])
    torn = tmp_path / "torn.jsonl"
    torn.write_text(
        '{"rollout_log_probs": [-1.0], "old_log_probs": [-1.0]}\n{"old_log_probs": [-1]}\n'
    )
    return [
        (wrong, "judge.ragged_mismatch"),
        (skew, "judge.ragged_mismatch"),
        (past, "judge.unreadable"),
        (lying, "judge.unreadable"),
        (torn, "judge.bad_value"),
    ]


def test_bad_ragged_and_lying_dumps_exit_2_and_write_nothing(xconf_cli, tmp_path: Path) -> None:
    out = tmp_path / "out"
    for path, code_name in _bad(tmp_path):
        before = snapshot(tmp_path)
        code, _, err = xconf_cli("judge", path, "--dtype", "float32", "--output-root", out)
        assert code == 2 and f"[{code_name}]" in err, (path.name, err)
        assert snapshot(tmp_path) == before and not out.exists(), path.name


@pytest.mark.slow
def test_a_verl_sized_dump_judges_seals_reports_and_verifies(xconf_cli, tmp_path: Path) -> None:
    """512 x 2048 float32 (over half a million active tokens) with token ids."""
    g = torch.Generator().manual_seed(0)
    b, t = 512, 2048
    rollout = -5.0 * torch.rand(b, t, generator=g)
    training = rollout - 3e-6 * torch.rand(b, t, generator=g).square() * 4
    lengths = torch.randint(t // 4, t + 1, (b,), generator=g)
    mask = (torch.arange(t)[None] < lengths[:, None]).to(torch.int64)
    ids = torch.randint(0, 49_152, (b, t), generator=g)
    path = _save(tmp_path / "big.safetensors", rollout, training, mask=mask, responses=ids)
    out = tmp_path / "out"
    code, _, err = xconf_cli("judge", path, "--output-root", out)
    assert code == 1, err  # some of the 4*3e-6 differences exceed 1e-5
    run = out / "judge"
    attempt = _attempt(run, "big")
    doc = _doc(run, "big")
    assert doc["active_tokens"] == int(mask.sum()) > 500_000 and doc["mismatches"] > 0
    # every per-token payload is safetensors: the JSON documents stay small
    for name in ("identity.json", "actual.json", "requested.json", "materialized.json"):
        assert (attempt / name).stat().st_size < 64 * 1024, name
    score = load_file(str(attempt / "score_rollout.safetensors"))
    assert torch.equal(score["token_ids"].long(), ids)
    assert (run / "report.html").is_file()
    assert xconf_cli("verify", run)[0] == 0


@pytest.mark.slow
def test_comparison_quantiles_and_drift_profile_are_torch_s_bit_for_bit_at_any_size() -> None:
    from xconf.comparison import PERCENTILES, _drift_profile, quantiles

    g = torch.Generator().manual_seed(1)
    for n in (1, 2, 3, 10, 1001, 4097):
        values = torch.rand(n, generator=g) * 1e-5
        expected = {k: float(torch.quantile(values.double(), q)) for k, q in PERCENTILES.items()}
        assert quantiles(values, PERCENTILES) == expected, n
    diff = torch.rand(64, 300, generator=g)
    active = torch.rand(64, 300, generator=g) > 0.4
    diff = torch.where(active, diff, 0.0)
    loop = []
    for position in range(300):  # the per-position definition, one column at a time
        column = diff[:, position][active[:, position]].double()
        if column.numel():
            loop.append(
                {
                    "position": position,
                    "active": column.numel(),
                    "mean_abs_diff": float(column.mean()),
                    "max_abs_diff": float(column.max()),
                }
            )
    assert _drift_profile(diff, active) == loop
    # torch.quantile refuses more than 2**24 values; a 4096 x 4096 batch plus one has more
    big = torch.rand((1 << 24) + 1, generator=g)
    with pytest.raises(RuntimeError):
        torch.quantile(big.double(), 0.5)
    assert 0.0 < quantiles(big, {"p50": 0.5})["p50"] < 1.0


def test_a_bfloat16_dump_gets_verl_s_figures_in_bfloat16(xconf_cli, tmp_path: Path) -> None:
    """The verdict runs in float32 (exact for bfloat16); verl's figures in the dumped dtype."""
    from xconf.rollout_correction import PREFIX, verl_figures

    rollout = R.bfloat16()
    training = (R - 0.03).bfloat16()
    path = _save(tmp_path / "bf16.safetensors", rollout, training)
    code, _, err = xconf_cli("judge", path, "--dtype", "bfloat16", "--output-root", tmp_path / "o")
    assert code == 0, err
    doc = _doc(tmp_path / "o" / "judge", "bf16")["rollout_correction"]
    assert doc["dtype"] == "bfloat16"
    expected = verl_figures(rollout, training, torch.ones(2, 4, dtype=torch.int64))
    assert doc["metrics"] == {k: expected[PREFIX + k] for k in doc["metrics"]}
    as_float32 = verl_figures(rollout.float(), training.float(), torch.ones(2, 4))
    assert any(doc["metrics"][k] != as_float32[PREFIX + k] for k in doc["metrics"])


def test_a_safetensors_dump_is_read_in_file_order_into_its_own_tensors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Tiny chunks and a threaded digest for every chunk: the skipped bytes (a tensor judge
    # does not keep, between the kept ones) go through both alternating buffers, and the
    # digest is still the file's, every kept tensor its own memory, equal to safetensors'.
    from xconf.artifacts.layout import StreamDigest
    from xconf.judge import formats

    monkeypatch.setattr(formats, "CHUNK", 24)
    monkeypatch.setattr(StreamDigest, "THREADED", 1)
    g = torch.Generator().manual_seed(5)
    tensors = {
        "rollout_log_probs": -torch.rand(3, 40, generator=g),
        "old_log_probs": -torch.rand(3, 40, generator=g),
        "big_unwanted": torch.rand(7, 50, generator=g, dtype=torch.float64),
        "response_mask": torch.ones(3, 40, dtype=torch.int64),
        "empty": torch.zeros(0, 3),
    }
    path = tmp_path / "d.safetensors"
    save_file(tensors, str(path), metadata={"dtype": "float32"})
    wanted = {"rollout_log_probs", "old_log_probs", "response_mask", "empty"}
    parsed = formats.parse_dump(path, wanted)
    assert parsed.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert parsed.size == path.stat().st_size and parsed.meta == {"dtype": "float32"}
    assert set(parsed.columns) == wanted and "big_unwanted" in parsed.names
    stored = load_file(str(path))
    for name in wanted:
        assert torch.equal(parsed.columns[name].values, stored[name]), name


def test_a_safetensors_dump_with_overlapping_tensors_is_refused(tmp_path: Path) -> None:
    from xconf.judge.formats import JudgeError, parse_dump

    data = _save(tmp_path / "good.safetensors", R, R.clone()).read_bytes()
    (length,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8 : 8 + length])
    header["old_log_probs"]["data_offsets"] = header["rollout_log_probs"]["data_offsets"]
    text = json.dumps(header).encode()
    lying = tmp_path / "overlap.safetensors"
    lying.write_bytes(struct.pack("<Q", len(text)) + text + data[8 + length :])
    with pytest.raises(JudgeError) as raised:
        parse_dump(lying, {"rollout_log_probs", "old_log_probs", "response_mask"})
    assert raised.value.code == "judge.unreadable" and "overlaps" in raised.value.message
