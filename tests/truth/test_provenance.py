"""Provenance: batch.size read from answered requests, logp.backend's three stages, versions."""

from __future__ import annotations

import copy

import pytest

from tests.core.runs import attempt_doc, only, run_doc
from xconf.runtime.requests import batch_size_from_requests


@pytest.mark.parametrize(
    ("sizes", "requested", "shown"),
    [
        ([2, 2], 2, 2),
        ([4], 8, 8),  # one request of every sample: what any batch >= 4 gives
        ([1, 1, 1, 1], 1, 1),
        ([3, 1], 3, 3),
        ([4], 2, 4),  # the engine merged the two requests: a fallback, not applied
        ([2, 1, 1], 2, 2),
        ([], 2, None),
    ],
)
def test_batch_size_is_read_from_the_requests_answered(sizes, requested, shown) -> None:
    assert batch_size_from_requests(sizes, requested) == shown


def test_actual_records_logp_backend_and_batch_from_the_engine(s0_doc, tmp_path) -> None:
    doc = only(copy.deepcopy(s0_doc), logp__backend=["xconf.reference_logp"])
    summary = run_doc(doc, tmp_path)
    actual = attempt_doc(summary, "logp.backend=xconf.reference_logp", "actual.json")
    for side in ("rollout", "training"):
        rows = {a["path"]: a for a in actual["sides"][side]}
        backend = rows["logp.backend"]
        assert (backend["requested"], backend["materialized"], backend["actual"]) == (
            "xconf.reference_logp",
            "xconf.reference_logp",
            "xconf.reference_logp",
        )
        assert backend["status"] == "applied"
        assert rows["batch.size"]["actual"] == 2
    requested = attempt_doc(summary, "logp.backend=xconf.reference_logp", "requested.json")
    assert requested["changed"] == {"logp.backend": "xconf.reference_logp"}


def test_active_mask_digest_is_in_the_provenance(s0_doc, tmp_path) -> None:
    import hashlib

    import torch

    summary = run_doc(only(copy.deepcopy(s0_doc)), tmp_path)
    inputs = attempt_doc(summary, "baseline", "actual.json")["provenance"]["inputs"]
    mask = torch.tensor(s0_doc["identity"]["active_mask"]).bool()
    h = hashlib.sha256(f"{mask.dtype}:{tuple(mask.shape)}".encode())
    h.update(mask.numpy().tobytes())
    assert inputs["active_mask_sha256"] == h.hexdigest()


def test_one_case_run_alone_keeps_its_intervention(s0_doc, tmp_path) -> None:
    """A sweep job plans its one case as a baseline; requested.json still says what changed."""
    run_doc(only(copy.deepcopy(s0_doc), batch__size=[1]), tmp_path / "out")  # seals the plan
    job = only(copy.deepcopy(s0_doc))
    job["baseline"]["batch"]["size"] = 1
    summary = run_doc(job, tmp_path / "out", resume=False)
    requested = attempt_doc(summary, "baseline", "requested.json")
    assert requested["changed"] == {"batch.size": 1}


def test_an_intervention_equal_to_the_baseline_is_reported(s0_doc, tmp_path) -> None:
    import json
    from pathlib import Path

    summary = run_doc(only(copy.deepcopy(s0_doc), rollout__dtype=["fp32", "bf16"]), tmp_path)
    rows = (Path(summary.experiment_dir) / "plan.jsonl").read_text().splitlines()
    assert json.loads(rows[0])["same_as_baseline"] == {"rollout.dtype": "float32"}
    assert len(rows) == 2
