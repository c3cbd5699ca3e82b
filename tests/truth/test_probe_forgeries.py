"""Forgeries the independent probes found believed: each record edited, every digest that would
give it away recomputed (the seal, the execution key, the identity's inner sha256, the plan's
seal), yet the attempt still disagrees with the rest of the run. `xconf verify` names it
offline, and a resume never reuses it (it rescores the case, or refuses the plan)."""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load_file, save

from tests.core.runs import only, run_doc
from tests.truth.forgery import edit_json, edit_plan, json_bytes, reseal
from xconf.canonical import canonical_digest
from xconf.contract.loader import load_contract
from xconf.errors import ArtifactError
from xconf.verify import verify_run

# batch.size=1 passes, rollout.dtype=bfloat16 fails (bf16 rollout drifts past its threshold).
PASSING, FAILING = "batch.size=1", "rollout.dtype=bfloat16"


@pytest.fixture
def sealed(s0_doc, tmp_path) -> tuple[dict[str, Any], Path, dict[str, Path]]:
    doc = only(copy.deepcopy(s0_doc), batch__size=[1], rollout__dtype=["bfloat16"])
    summary = run_doc(doc, tmp_path)
    results = {r.label: r.result for r in summary.records}
    assert results == {"baseline": "pass", PASSING: "pass", FAILING: "fail"}
    run = Path(summary.experiment_dir)
    attempts = {r.label: run / "cases" / r.case_id / r.attempt_id for r in summary.records}
    assert verify_run(run).exit_code == 0
    return doc, run, attempts


def _row(rows: list[dict[str, Any]], attempt: Path) -> dict[str, Any]:
    return next(r for r in rows if r["case_id"] == attempt.parent.name)


def _relabel(run: Path, attempts: dict[str, Path]) -> None:
    def edit(rows: list[dict[str, Any]]) -> None:
        row = _row(rows, attempts[PASSING])
        row["changed"], row["knobs"]["batch.size"] = {"batch.size": 3}, 3

    edit_plan(run, edit)


def _label_only(run: Path, attempts: dict[str, Path]) -> None:
    def edit(rows: list[dict[str, Any]]) -> None:
        _row(rows, attempts[PASSING])["changed"] = {"rollout.enforce_eager": False}

    edit_plan(run, edit)


def _undeclared(run: Path, attempts: dict[str, Path]) -> None:
    def edit(rows: list[dict[str, Any]]) -> None:
        _row(rows, attempts[FAILING])["changed"] = {}  # the bf16 case shown as a baseline

    edit_plan(run, edit)


def _requested(run: Path, attempts: dict[str, Path]) -> None:
    edit_json(attempts[PASSING], "requested.json", lambda d: d["knobs"].update({"batch.size": 3}))


def _other_case(run: Path, attempts: dict[str, Path]) -> None:
    """The passing attempt copied over the failing case's, every id in it rewritten."""
    source, target = attempts[PASSING], attempts[FAILING]
    case = target.parent.name
    shutil.rmtree(target)
    shutil.copytree(source, target)
    seal = json.loads((target / "COMPLETE").read_text())
    seal["case_id"] = case
    (target / "COMPLETE").write_bytes(json_bytes(seal))
    for name in ("score_rollout", "score_training", "token_diffs"):
        file = target / f"{name}.safetensors"
        reseal(target, file.name, save(load_file(str(file)), metadata={"case_id": case}))
    for name in ("requested.json", "comparison.json"):
        edit_json(target, name, lambda d: d.update({"case_id": case}))


def _contract(run: Path, attempts: dict[str, Path]) -> None:
    edit_json(attempts[PASSING], "comparison.json", lambda d: d["contract"].update(version="1"))


def _made_up_contract(run: Path, attempts: dict[str, Path]) -> None:
    """Every record names another contract, experiment.json too: before, a contract the
    package does not ship carried the verdict unchecked (its threshold was never compared)."""
    made_up = {"version": "9999.1.0", "sha256": "0" * 64}
    header = json.loads((run / "experiment.json").read_text())
    header["contract"].update(made_up)
    (run / "experiment.json").write_bytes(json_bytes(header))
    for attempt in attempts.values():
        edit_json(attempt, "comparison.json", lambda d: d["contract"].update(made_up))


def _checkpoint(run: Path, attempts: dict[str, Path]) -> None:
    def edit(identity: dict[str, Any]) -> None:
        identity["checkpoint_id"] = "another-checkpoint"
        identity["sha256"] = canonical_digest({k: v for k, v in identity.items() if k != "sha256"})

    edit_json(attempts[PASSING], "identity.json", edit)


def _readback(run: Path, attempts: dict[str, Path]) -> None:
    def edit(actual: dict[str, Any]) -> None:
        for knob in actual["sides"]["training"]:
            if knob["path"] == "training.compute_dtype":
                knob["actual"] = "bfloat16"  # the engine ran bf16, the status still 'applied'

    edit_json(attempts[PASSING], "actual.json", edit)


def _judged_dtype(run: Path, attempts: dict[str, Path]) -> None:
    """comparison.json claims a bf16 rollout: the looser threshold, the tensors to match."""
    attempt = attempts[PASSING]
    loose = load_contract().threshold_for("bfloat16", "float32").value
    diffs = load_file(str(attempt / "token_diffs.safetensors"))
    diffs["threshold"] = np.array(loose, dtype=diffs["threshold"].dtype)
    reseal(attempt, "token_diffs.safetensors", save(diffs, metadata={"case_id": "x"}))
    edit_json(
        attempt,
        "comparison.json",
        lambda d: d.update(rollout_dtype="bfloat16", threshold=float(np.float32(loose))),
    )


def _dress(attempt: Path) -> None:
    """A scored attempt dressed as a judged dump: a `dump` record added, the sides removed
    (before, the checks of a scored attempt were skipped for it)."""
    dump = {"file": "x.safetensors", "sha256": "0" * 64, "declared": {}, "source_dtypes": {}}

    def dressed(d: dict[str, Any]) -> None:
        d.update(dump=dump)
        d.pop("sides")

    edit_json(attempt, "actual.json", dressed)
    edit_json(attempt, "materialized.json", lambda d: d.pop("sides"))


def _dressed_other_case(run: Path, attempts: dict[str, Path]) -> None:
    _other_case(run, attempts)
    _dress(attempts[FAILING])


def _dressed_judged_dtype(run: Path, attempts: dict[str, Path]) -> None:
    _judged_dtype(run, attempts)
    _dress(attempts[PASSING])


Forgery = Callable[[Path, dict[str, Path]], None]
# (forgery, what verify names, the case a resume must rescore; None: the resume refuses)
FORGERIES: dict[str, tuple[Forgery, str, str | None]] = {
    "plan-relabel": (_relabel, "requested.json knobs differ from the case's row", None),
    "plan-label-only": (_label_only, "declares rollout.enforce_eager=False", None),
    "plan-undeclared": (_undeclared, "declares baseline, but its knobs change", None),
    "requested-knob": (_requested, "requests 1, requested.json 3", PASSING),
    "other-case-attempt": (_other_case, "requested.json knobs differ", FAILING),
    "comparison-contract": (_contract, "is not the numerical contract this package ships", PASSING),
    "made-up-contract": (
        _made_up_contract,
        "is not the numerical contract this package ships",
        None,
    ),
    "identity-checkpoint": (_checkpoint, "scored on 2 frozen identities", None),
    "readback-dtype": (_readback, "with status 'applied'; that readback gives 'fallback'", PASSING),
    "judged-dtype": (_judged_dtype, "judges dtypes ['bfloat16', 'float32']", PASSING),
    # fourth campaign: the kind of an attempt is its run's, never the attempt's own claim
    "dressed-other-case": (_dressed_other_case, "not the layout of a scored attempt", FAILING),
    "dressed-judged-dtype": (_dressed_judged_dtype, "not the layout of a scored attempt", PASSING),
}


@pytest.mark.parametrize("kind", sorted(FORGERIES))
def test_a_forgery_consistent_with_its_own_digests_is_still_caught(sealed, tmp_path, kind) -> None:
    doc, run, attempts = sealed
    forge, named, rescored = FORGERIES[kind]
    forge(run, attempts)
    report = verify_run(run)
    reasons = " | ".join(f.reason or "" for f in report.findings if f.status == "damaged")
    assert report.exit_code == 1 and named in reasons, reasons
    if rescored is None:  # the run refuses to score under a plan or identity it did not make
        with pytest.raises(ArtifactError) as refused:
            run_doc(copy.deepcopy(doc), tmp_path)
        assert refused.value.code in ("artifacts.experiment_conflict", "artifacts.plan_seal")
        return
    again = {r.label: r for r in run_doc(copy.deepcopy(doc), tmp_path).records}
    assert not again[rescored].reused
    assert {k: r.result for k, r in again.items()} == {
        "baseline": "pass",
        PASSING: "pass",
        FAILING: "fail",
    }
