"""A knob that is not the intervention and did not run as set confounds the case.

Strict execution refuses it (``error``). Without strict execution the case is measured, but
it says it is confounded, naming the knob, never counts as evidence about its intervention,
and is judged at the threshold of the dtypes the engines actually ran.
"""

from __future__ import annotations

import copy
from pathlib import Path

from rich.console import Console

from tests.core.runs import attempt_doc, only, run_doc
from tests.truth import liars
from xconf.cli.render import verdict_table
from xconf.contract.loader import load_contract
from xconf.verify import verify_run

CASE = "training.attention_backend=eager"


def _doc(s0_doc, strict: bool):
    doc = only(copy.deepcopy(s0_doc), training__attention_backend=["eager"])
    doc["strict_fallback"] = strict
    return doc


def test_a_confounded_case_is_an_error_under_strict(s0_doc, tmp_path) -> None:
    summary = run_doc(_doc(s0_doc, True), tmp_path, adapter=liars.TrainsInBfloat16())
    record = next(r for r in summary.records if r.label == CASE)
    assert record.result == "error"
    assert "training:training.compute_dtype fell back" in (record.reason or "")


def test_a_confounded_case_names_the_knob_and_follows_the_dtypes_that_ran(s0_doc, tmp_path) -> None:
    summary = run_doc(_doc(s0_doc, False), tmp_path, adapter=liars.TrainsInBfloat16())
    record = next(r for r in summary.records if r.label == CASE)
    comparison = attempt_doc(summary, CASE, "comparison.json")
    bf16 = load_contract().threshold_for("float32", "bfloat16").value
    assert comparison["training_dtype"] == "bfloat16"
    assert (
        comparison["threshold"] == bf16 != load_contract().threshold_for("float32", "float32").value
    )
    confounded = comparison["intervention"]["confounded"]
    assert [(c["side"], c["path"], c["status"]) for c in confounded] == [
        ("training", "training.compute_dtype", "fallback")
    ]
    assert comparison["intervention"]["applied"] is False
    assert record.confounded == ("training:training.compute_dtype",)
    assert "confounded" in (record.reason or "") and "training.compute_dtype" in (
        record.reason or ""
    )
    console = Console(width=300, record=True)
    console.print(verdict_table(summary))
    assert "confounded: training:training.compute_dtype" in console.export_text()
    # The sealed attempt re-judges offline at the threshold it records, and resume reuses it.
    assert verify_run(Path(summary.experiment_dir)).exit_code == 0
    again = run_doc(_doc(s0_doc, False), tmp_path, adapter=liars.TrainsInBfloat16())
    assert all(r.reused for r in again.records)
