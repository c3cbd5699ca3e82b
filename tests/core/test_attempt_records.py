"""The typed attempt records (xconf/case_documents.py): a record is never changed by
publishing it, and a judged attempt's head gives the key verify recomputes from the
records it writes."""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from safetensors.torch import save_file

from xconf.artifacts.layout import COMPARISON_NAME
from xconf.artifacts.store import ExperimentStore, read_json
from xconf.case_documents import Comparison
from xconf.comparison import Intervention, error_outcome
from xconf.contract.loader import load_contract
from xconf.judge import records
from xconf.judge.dumps import Keys, load_dump
from xconf.judge.seal import judge_cases, resolve_dtypes


def test_a_comparison_record_leaves_its_verdict_as_it_was() -> None:
    contract = load_contract()
    error = {"code": "runtime.exception", "path": None, "message": "boom"}
    verdict = error_outcome(contract.threshold_for("float32", "float32"), contract, error)
    before = copy.deepcopy(verdict.document)
    record = Comparison(
        verdict, "c-1", ("bfloat16", "float32"), Intervention(("rollout.dtype",)), "confounded"
    )
    published = record.to_dict()
    assert verdict.document == before  # the verdict is the same for every case built on it
    assert (published["case_id"], published["rollout_dtype"]) == ("c-1", "bfloat16")
    assert published["intervention"]["declared"] == ["rollout.dtype"]
    assert published["reason"] == "boom"  # the verdict's own reason stands
    assert record.to_dict() == published


def test_a_judged_head_gives_the_key_its_records_give(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(0)
    rollout = -torch.rand(3, 5, generator=g)
    path = tmp_path / "d.safetensors"
    tensors = {
        "rollout_log_probs": rollout,
        "old_log_probs": rollout.clone(),
        "response_mask": torch.ones(3, 5),
    }
    save_file(tensors, str(path), metadata={"dtype": "float32"})
    case = resolve_dtypes(load_dump("d", path, Keys()), None, None, None)
    judge_cases(ExperimentStore(tmp_path / "out", "j"), [case])
    (attempt,) = (tmp_path / "out" / "j" / "cases" / "d").iterdir()
    seal = read_json(attempt / "COMPLETE")
    docs = {n: read_json(attempt / n) for n in ("identity.json", "actual.json", COMPARISON_NAME)}
    dump = docs["actual.json"]["dump"]
    key = records.execution_key(
        "d",
        docs["identity.json"]["sha256"],
        dump["sha256"],
        ["float32", "float32"],
        docs[COMPARISON_NAME]["contract"],
        dump["correction"],
    )
    assert seal["execution_key"] == key
    assert "strict_execution" not in read_json(attempt / "requested.json")  # no engine ran
