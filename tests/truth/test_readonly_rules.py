"""Read-only rules a scorer could break unseen: an optimizer over the model, other tokens
scored behind a faithful echo, identity fields the contract lists."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from tests.core.runs import attempt_doc, only, run_doc
from tests.truth import liars
from xconf.verify import verify_run

CASE = "training.attention_backend=eager"


def _run(s0_doc, tmp_path, adapter):
    doc = only(copy.deepcopy(s0_doc), training__attention_backend=["eager"])
    return run_doc(doc, tmp_path, adapter=adapter)


@pytest.mark.parametrize(
    ("liar", "code"),
    [
        (liars.OwnsOptimizer, "identity.optimizer_owned"),
        (liars.ScoresOtherTokens, "identity.scored_other_tokens"),
    ],
)
def test_a_broken_read_only_rule_is_invalid_identity(s0_doc, tmp_path, liar, code) -> None:
    summary = _run(s0_doc, tmp_path, liar())
    results = {r.label: r.result for r in summary.records}
    assert results == {"baseline": "pass", CASE: "invalid_identity"}
    assert attempt_doc(summary, CASE, "comparison.json")["error"]["code"] == code
    checked = attempt_doc(summary, "baseline", "actual.json")["scored_tokens_checked_from"]
    assert checked == {"rollout": "model record", "training": "model record"}
    # the refusal is itself a verdict: verify finds every record consistent
    assert verify_run(Path(summary.experiment_dir)).exit_code == 0


@pytest.mark.parametrize(
    ("field", "code"),
    [
        ("tokenizer_id", "runtime.tokenizer_id_mismatch"),
        ("model_version", "runtime.model_version_mismatch"),
    ],
)
def test_s0_checks_the_identitys_tokenizer_and_model_version(s0_doc, tmp_path, field, code) -> None:
    doc = only(copy.deepcopy(s0_doc))
    doc["identity"][field] = "something-else"
    summary = run_doc(doc, tmp_path)
    assert [r.result for r in summary.records] == ["invalid_identity"]
    assert attempt_doc(summary, "baseline", "comparison.json")["error"]["code"] == code
