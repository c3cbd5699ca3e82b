"""Forged judged attempts (fourth campaign): each record edited and every digest that would
give it away recomputed (the seal, the plan seal, the execution key where one is checked),
yet the attempt disagrees with what its own records prove. `xconf verify` names it, and a
judge resume never reuses it. Before: each of these verified 0."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save, save_file

from tests.truth.forgery import edit_plan, json_bytes, reseal
from xconf.verify import verify_run

LOOSE = 5e-2  # the contract's bfloat16 threshold


def _dump(path: Path, delta: float, **metadata: str) -> Path:
    g = torch.Generator().manual_seed(7)
    rollout = -torch.rand((3, 6), generator=g) - 0.1
    training = rollout.clone()
    training[1, 2] += delta
    tensors = {"rollout_log_probs": rollout, "old_log_probs": training}
    save_file({**tensors, "response_mask": torch.ones((3, 6))}, str(path), metadata=metadata)
    return path


@pytest.fixture
def judged(xconf_cli, tmp_path: Path) -> Callable[..., tuple[Path, dict[str, Path]]]:
    """`good` passes at float32, `bad` fails at float32 by 3e-2 (a bfloat16 pass)."""

    def make(*dtype_args: str, **metadata: str) -> tuple[Path, dict[str, Path]]:
        good = _dump(tmp_path / "good.safetensors", 1e-6, **metadata)
        bad = _dump(tmp_path / "bad.safetensors", 3e-2, **metadata)
        out = tmp_path / "out"
        argv = ["judge", "--case", f"good={good}", "--case", f"bad={bad}", *dtype_args]
        code, _, err = xconf_cli(*argv, "--output-root", out)
        assert code == 1, err
        run = out / "judge"
        assert verify_run(run).exit_code == 0
        return run, {c: run / "cases" / c / "a-0001" for c in ("good", "bad")}

    return make


def _rekey(attempt: Path) -> None:
    """The forger recomputes the judged execution key too, where one is checked."""
    try:
        from xconf.judge.records import execution_key
    except ImportError:  # before the fix no judged key was ever recomputed
        return
    docs = {n: json.loads((attempt / n).read_text()) for n in ("identity.json", "actual.json")}
    comparison = json.loads((attempt / "comparison.json").read_text())
    dump = docs["actual.json"]["dump"]
    dtypes = (comparison["rollout_dtype"], comparison["training_dtype"])
    seal = json.loads((attempt / "COMPLETE").read_text())
    seal["execution_key"] = execution_key(
        seal["case_id"],
        docs["identity.json"]["sha256"],
        dump["sha256"],
        dtypes,
        comparison["contract"],
        dump.get("correction"),
    )
    (attempt / "COMPLETE").write_bytes(json_bytes(seal))


def _edit(attempt: Path, name: str, edit: Callable[[dict[str, Any]], None]) -> None:
    """``edit`` a record and reseal it (COMPLETE itself is only rewritten)."""
    document = json.loads((attempt / name).read_text())
    edit(document)
    if name == "COMPLETE":
        (attempt / name).write_bytes(json_bytes(document))
    else:
        reseal(attempt, name, json_bytes(document))


def _relabel_bf16(
    run: Path, attempt: Path, *, actual: bool = False, declared: bool = False
) -> None:
    """The float32 fail judged again at the bfloat16 threshold, every record but actual.json
    (or, with ``actual``, its recorded dtypes too) telling the same story."""
    knobs = {"rollout.dtype": "bfloat16", "training.compute_dtype": "bfloat16"}
    diffs = load_file(str(attempt / "token_diffs.safetensors"))
    diffs["threshold"] = torch.tensor(LOOSE, dtype=diffs["threshold"].dtype)
    diffs["mismatch_mask"] = torch.zeros_like(diffs["mismatch_mask"])
    reseal(attempt, "token_diffs.safetensors", save(diffs, metadata={"case_id": "bad"}))

    def comparison(doc: dict[str, Any]) -> None:
        doc.update(rollout_dtype="bfloat16", training_dtype="bfloat16", threshold=LOOSE)
        doc.update(result="pass", mismatches=0, mismatch_ratio=0.0)

    _edit(attempt, "comparison.json", comparison)
    _edit(attempt, "requested.json", lambda d: d.update(knobs=knobs))
    if actual:
        _edit(attempt, "actual.json", lambda d: d["dump"].update(dtypes={
            "rollout": "bfloat16", "training": "bfloat16"}))  # fmt: skip
    if declared:  # every record consistent: the dump's own declared keys rewritten too
        _edit(attempt, "actual.json", lambda d: d["dump"].update(declared={"dtype": "bfloat16"}))
    _edit(attempt, "COMPLETE", lambda d: d.update(result="pass"))
    _rekey(attempt)
    edit_plan(run, lambda rows: next(r for r in rows if r["case_id"] == "bad").update(knobs=knobs))


def _other_case(run: Path, attempts: dict[str, Path]) -> None:
    """The passing attempt copied over the failing case's, every id in it rewritten."""
    source, target = attempts["good"], attempts["bad"]
    shutil.rmtree(target)
    shutil.copytree(source, target)
    for name in ("requested.json", "materialized.json", "comparison.json"):
        _edit(target, name, lambda d: d.update(case_id="bad"))
    _edit(target, "requested.json", lambda d: d.update(changed={"dump": "bad"}))
    for name in ("score_rollout", "score_training", "token_diffs"):
        file = target / f"{name}.safetensors"
        reseal(target, file.name, save(load_file(str(file)), metadata={"case_id": "bad"}))
    _edit(target, "COMPLETE", lambda d: d.update(case_id="bad"))
    _rekey(target)


def _damaged(run: Path) -> str:
    report = verify_run(run)
    assert report.exit_code == 1, report.findings
    return " | ".join(f.reason or "" for f in report.findings if f.status == "damaged")


def _judge_again(xconf_cli, run: Path) -> tuple[int, str]:
    dumps = run.parent.parent
    code, stdout, _ = xconf_cli(
        "judge", "--case", f"good={dumps / 'good.safetensors'}",
        "--case", f"bad={dumps / 'bad.safetensors'}", "--dtype", "float32",
        "--output-root", run.parent,
    )  # fmt: skip
    return code, stdout


def test_a_float32_fail_relabelled_bfloat16_is_named(judged) -> None:
    run, attempts = judged("--dtype", "float32")
    _relabel_bf16(run, attempts["bad"])
    assert "actual.json proves ['float32', 'float32']" in _damaged(run)


def test_a_relabel_of_the_recorded_dtypes_is_named_by_the_dumps_own_keys(judged) -> None:
    run, attempts = judged(dtype="float32")  # the dump declares float32 itself
    _relabel_bf16(run, attempts["bad"], actual=True)
    reasons = _damaged(run)
    assert "the dump's declared keys {'dtype': 'float32'} give 'float32'" in reasons, reasons


def test_an_attempt_copied_into_another_case_is_named(judged) -> None:
    """The copy is consistent with itself (its records all name the good dump): the header's
    binding of each case to its dump tells."""
    run, attempts = judged("--dtype", "float32")
    _other_case(run, attempts)
    assert "binds the cases to other dumps" in _damaged(run)


def test_a_copy_under_the_cases_own_key_is_never_reused(judged, xconf_cli) -> None:
    """The copy sealed under the key the bad case's own attempt had (what a resume looks
    up): before, `xconf judge` reused it and reported the failing dump as a pass."""
    run, attempts = judged("--dtype", "float32")
    key = json.loads((attempts["bad"] / "COMPLETE").read_text())["execution_key"]
    _other_case(run, attempts)
    _edit(attempts["bad"], "COMPLETE", lambda d: d.update(execution_key=key))
    code, stdout = _judge_again(xconf_cli, run)
    assert code == 1, stdout
    again = json.loads((run / "cases" / "bad" / "a-0002" / "comparison.json").read_text())
    assert again["result"] == "fail"


def test_a_relabel_consistent_in_every_record_is_named_by_the_dump_itself(judged) -> None:
    """Every record (actual.json's declared keys included) says bfloat16; the dump, still at
    its sealed path with its sealed digest, declares float32."""
    run, attempts = judged(dtype="float32")
    _relabel_bf16(run, attempts["bad"], actual=True, declared=True)
    reasons = _damaged(run)
    assert "declares {'dtype': 'float32'}; actual.json records {'dtype': 'bfloat16'}" in reasons
