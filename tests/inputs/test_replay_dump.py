"""A real S2 run's tokens dumped in verl's layout, judged, then replayed as the frozen identity
(``identity=from_dump``) on the same checkpoint: the very same token ids and verdicts.

The failing dump is the baseline's with one planted mismatch (the bfloat16 case's own verdict
on the random-weight toy rests on a few tokens and on the CPU's kernels): it fails on any CPU,
and it carries the same frozen tokens as every case of the run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.adapters.conftest import needs_vllm
from tests.inputs.test_real_inputs_e2e import _run
from tests.inputs.verl_layout import planted_drift, verl_tensors
from xconf.experiment import Intervention

pytestmark = [needs_vllm, pytest.mark.slow]
KNOB = Intervention("rollout.dtype", ("bfloat16",))


def _attempt(summary: Any, record: Any) -> Path:
    return Path(summary.experiment_dir) / "cases" / record.case_id / record.attempt_id


def _by_label(summary: Any) -> dict[str, Any]:
    return {r.label: r for r in summary.records}


@pytest.fixture(scope="module")
def sampled(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """S2 on the tiny model: the recipe's baseline rollout freezes the tokens."""
    base = tmp_path_factory.mktemp("replay")
    summary, _ = _run("s2_cpu", "vllm_hf", [], base / "sampled", KNOB)
    return summary, base


def test_dumped_judged_and_replayed_give_the_same_tokens_and_verdicts(
    sampled: Any, xconf_cli: Any
) -> None:
    import hashlib

    from safetensors.torch import load_file, save_file

    summary, base = sampled
    first = _by_label(summary)
    assert first["baseline"].result == "pass"
    assert first["rollout.dtype=bfloat16"].result in ("pass", "fail")  # as this CPU gives it
    dumps = {}
    for label, record in first.items():
        attempt = _attempt(summary, record)
        doc = json.loads((attempt / "comparison.json").read_text())
        path = base / f"{record.case_id}.safetensors"
        metadata = {"rollout_dtype": doc["rollout_dtype"], "training_dtype": "float32"}
        save_file(verl_tensors(attempt), str(path), metadata=metadata)
        dumps[label] = path
        if label == "baseline":
            failing = base / "planted.safetensors"
            save_file(planted_drift(verl_tensors(attempt)), str(failing), metadata=metadata)

    # Judged: the verdicts of the run, and the failing dump names its replay command.
    argv: list[Any] = ["judge", "--output-root", base / "judged"]
    for label, path in dumps.items():
        argv += ["--case", f"{first[label].case_id}={path}"]
    code, stdout, err = xconf_cli(*argv, "--case", f"c-planted={failing}")
    assert code == 1, err
    verdicts = {r.case_id: (r.result, r.mismatches) for r in first.values()}
    verdicts["c-planted"] = ("fail", first["baseline"].mismatches + 1)
    for case_id, verdict in verdicts.items():
        (attempt,) = (base / "judged" / "judge" / "cases" / case_id).iterdir()
        doc = json.loads((attempt / "comparison.json").read_text())
        assert (doc["result"], doc["mismatches"]) == verdict, case_id
    assert f"identity=from_dump identity.dump={failing} " in stdout.replace("\n", "")
    assert f"identity.dump={dumps['baseline']}" not in stdout  # a passing dump needs no replay

    # Replayed: the dump's tokens frozen, nothing sampled, the same verdict on every case.
    replay, _ = _run(
        "s2_cpu",
        "vllm_hf",
        ["identity=from_dump", f"identity.dump={failing}"],
        base / "replayed",
        KNOB,
    )
    second = _by_label(replay)
    assert second.keys() == first.keys()
    for label, record in first.items():
        before, after = _attempt(summary, record), _attempt(replay, second[label])
        sampled_identity = json.loads((before / "identity.json").read_text())
        replayed_identity = json.loads((after / "identity.json").read_text())
        for field in ("token_ids", "selected_token_ids", "active_mask", "attention_mask"):
            assert replayed_identity[field] == sampled_identity[field], field
        assert replayed_identity["checkpoint_id"] == sampled_identity["checkpoint_id"]
        assert replayed_identity["recipe"]["kind"] == "from_dump"
        assert (
            replayed_identity["recipe"]["sha256"]
            == hashlib.sha256(failing.read_bytes()).hexdigest()
        )
        assert (second[label].result, second[label].mismatches) == (
            record.result,
            record.mismatches,
        )
        # Same tokens, same engines: the scores are bit for bit the sampled run's.
        for name in ("score_rollout.safetensors", "score_training.safetensors"):
            assert torch.equal(
                load_file(str(before / name))["logprobs"], load_file(str(after / name))["logprobs"]
            ), (label, name)
