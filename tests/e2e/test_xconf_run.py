"""`xconf run` end to end: sealed attempts, resume, tampering, offline recomputation."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import artifact_snapshot as snapshot
from tests.e2e.conftest import EXPERIMENT, xconf_run
from xconf.artifacts.safe_io import sha256_file
from xconf.artifacts.store import PAYLOAD_FILES, SEAL_NAME
from xconf.comparison import recompute_result


def plan_rows(root: Path) -> list[dict]:
    text = (root / EXPERIMENT / "plan.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


def attempts(root: Path, case_id: str) -> list[str]:
    return sorted(p.name for p in (root / EXPERIMENT / "cases" / case_id).iterdir())


def attempt_dir(root: Path, case_id: str, attempt: str = "a-0001") -> Path:
    return root / EXPERIMENT / "cases" / case_id / attempt


@pytest.fixture
def copied(first_run, tmp_path) -> Path:
    """A private copy of the first run's output root."""
    root = tmp_path / "out"
    shutil.copytree(first_run[0], root, symlinks=True)
    return root


def test_first_run_fails_only_on_offset_and_prints_the_table(first_run) -> None:
    root, code, output = first_run
    assert code == 1
    rows = plan_rows(root)
    assert len(rows) == 10
    results = {}
    for row in rows:
        comparison = json.loads((attempt_dir(root, row["case_id"]) / "comparison.json").read_text())
        label = ", ".join(f"{k}={v}" for k, v in row["changed"].items()) or "baseline"
        results[label] = comparison["result"]
        assert row["case_id"] in output
    assert results["logp.backend=smoke_only.logp_offset"] == "fail"
    for ref in ("xconf.reference_logp", "smoke_only.logp_reference"):
        assert results[f"logp.backend={ref}"] == "pass"
    assert results["baseline"] == "pass"
    assert "(new)" in output and "(reused)" not in output
    assert "fail" in output and "engines built" in output


def test_every_attempt_is_sealed(first_run) -> None:
    root = first_run[0]
    for row in plan_rows(root):
        assert attempts(root, row["case_id"]) == ["a-0001"]
        path = attempt_dir(root, row["case_id"])
        seal = json.loads((path / SEAL_NAME).read_text())
        assert sorted(seal["files"]) == sorted(PAYLOAD_FILES)
        assert seal["files"] == {name: sha256_file(path / name) for name in PAYLOAD_FILES}
        assert sorted(p.name for p in path.iterdir()) == sorted([*PAYLOAD_FILES, SEAL_NAME])
        assert not [p for p in path.rglob("*") if p.name.startswith(".")]  # no temporaries
        for name in PAYLOAD_FILES:
            if name.endswith(".safetensors"):
                data = (path / name).read_bytes()
                header = int.from_bytes(data[:8], "little")
                assert data[8:9] == b"{" and json.loads(data[8 : 8 + header])  # not a pickle


def test_token_diffs_recompute_every_verdict_offline(first_run) -> None:
    root = first_run[0]
    for row in plan_rows(root):
        path = attempt_dir(root, row["case_id"])
        comparison = json.loads((path / "comparison.json").read_text())
        diffs = load_file(str(path / "token_diffs.safetensors"))
        assert {"rollout_logprobs", "training_logprobs", "active_mask", "threshold"} <= set(diffs)
        # Stored in float32, the precision the verdict is computed in.
        assert diffs["threshold"].dtype == torch.float32
        assert float(diffs["threshold"]) == float(torch.tensor(comparison["threshold"]))
        assert recompute_result(diffs) == (comparison["result"], comparison["mismatches"])
        active = diffs["active_mask"].bool()
        for side in ("rollout", "training"):
            scores = load_file(str(path / f"score_{side}.safetensors"))
            assert (scores["logprobs"][active] == diffs[f"{side}_logprobs"][active]).all()


def test_rerun_scores_nothing_and_reuses_every_case(copied) -> None:
    before = snapshot(copied)
    code, output = xconf_run(copied)
    assert code == 1
    assert output.count("(reused)") == 10 and "(new)" not in output
    assert "engines built 0, reused 0" in output
    assert snapshot(copied) == before


TAMPERED = [*PAYLOAD_FILES, SEAL_NAME]


@pytest.mark.parametrize("index", range(len(TAMPERED)), ids=TAMPERED)
def test_a_flipped_byte_rescores_that_case_and_the_cases_that_took_its_sides(copied, index) -> None:
    name = TAMPERED[index]
    rows = plan_rows(copied)
    target = rows[index % len(rows)]["case_id"]  # spread the tampering over the cases
    # A case that took a side's scores from the tampered attempt (``reused_sides``) cannot
    # re-derive them any more: it is scored again with it, never resumed.
    rescored = {target} | {
        row["case_id"]
        for row in rows
        if any(
            source["case_id"] == target
            for source in json.loads(
                (attempt_dir(copied, row["case_id"]) / "actual.json").read_text()
            )
            .get("reused_sides", {})
            .values()
        )
    }
    path = attempt_dir(copied, target) / name
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    before = snapshot(copied)

    code, output = xconf_run(copied)
    assert code == 1
    assert output.count("(new)") == len(rescored)
    assert output.count("(reused)") == len(rows) - len(rescored)
    assert path.read_bytes() == bytes(data)  # the tampered attempt is left untouched
    after = snapshot(copied)
    assert {k: after[k] for k in before} == before  # nothing existing was rewritten
    new = sorted(set(after) - set(before))
    assert new and all(
        any(k.startswith(f"{EXPERIMENT}/cases/{case}/a-0002/") for case in rescored) for k in new
    )
    for row in rows:
        assert attempts(copied, row["case_id"]) == (
            ["a-0001", "a-0002"] if row["case_id"] in rescored else ["a-0001"]
        )


def test_a_partial_attempt_is_ignored(copied) -> None:
    target = plan_rows(copied)[3]["case_id"]
    (attempt_dir(copied, target) / SEAL_NAME).unlink()
    before = snapshot(copied)
    code, output = xconf_run(copied)
    assert code == 1
    assert output.count("(new)") == 1
    assert attempts(copied, target) == ["a-0001", "a-0002"]
    after = snapshot(copied)
    assert {k: after[k] for k in before} == before


def test_no_resume_scores_again_bitwise_identically(copied) -> None:
    before = snapshot(copied)
    code, output = xconf_run(copied, "--no-resume")
    assert code == 1
    assert output.count("(new)") == 10
    after = snapshot(copied)
    assert {k: after[k] for k in before} == before
    for row in plan_rows(copied):
        old, new = (attempt_dir(copied, row["case_id"], a) for a in ("a-0001", "a-0002"))
        for name in ("score_rollout.safetensors", "score_training.safetensors"):
            a, b = load_file(str(old / name)), load_file(str(new / name))
            assert sorted(a) == sorted(b)
            for key in a:
                assert a[key].dtype == b[key].dtype
                assert a[key].numpy().tobytes() == b[key].numpy().tobytes(), (name, key)
        for name in ("comparison.json", "requested.json", "materialized.json", "identity.json"):
            assert (old / name).read_bytes() == (new / name).read_bytes()
