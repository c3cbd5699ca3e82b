"""Forge-and-reseal: a payload edited and COMPLETE recomputed is caught by resume and verify.

Each forgery edits one payload kind of a sealed passing attempt and rewrites the seal so that
every file digest matches again; the strongest forger also recomputes the execution key from
the edited records. Resume re-derives the records from the current run and rescores; `xconf
verify` re-derives what it can offline and names the mismatch.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file, save

from tests.core.runs import only, run_doc
from tests.truth.forgery import json_bytes, reseal
from xconf.verify import verify_run


def _edit_json(name: str, edit: Callable[[dict[str, Any]], None]) -> Callable[[Path], bytes]:
    def forge(attempt: Path) -> bytes:
        document = json.loads((attempt / name).read_text())
        edit(document)
        return json_bytes(document)

    return forge


def _fallback(document: dict[str, Any]) -> None:
    knob = next(
        k for k in document["sides"]["rollout"]["knobs"] if k["path"] == "rollout.enforce_eager"
    )
    knob["status"] = "fallback"


def _tokenizer(document: dict[str, Any]) -> None:
    document["tokenizer_id"] = "another-tokenizer"  # the inner sha256 left as it was


def _torch(document: dict[str, Any]) -> None:
    document["provenance"]["engines"]["torch"] = "1.0.0"


def _mask(attempt: Path) -> bytes:
    tensors = load_file(str(attempt / "score_training.safetensors"))
    mask = tensors["active_mask"].clone()
    mask[0, -1] = 1 - mask[0, -1]
    tensors["active_mask"] = mask
    metadata = {"case_id": attempt.parent.name, "attempt_id": attempt.name}
    return save(tensors, metadata=metadata)


FORGERIES: dict[str, tuple[str, Callable[[Path], bytes], str]] = {
    "materialized-fallback": (
        "materialized.json",
        _edit_json("materialized.json", _fallback),
        "materialized.json differs",
    ),
    "identity-tokenizer": (
        "identity.json",
        _edit_json("identity.json", _tokenizer),
        "identity.json differs",
    ),
    "actual-torch": ("actual.json", _edit_json("actual.json", _torch), "actual.json provenance"),
    "training-mask": ("score_training.safetensors", _mask, "active_mask differs"),
}
OFFLINE = {  # what verify names for each, with no current run to compare with
    "materialized-fallback": "sealed execution key",
    "identity-tokenizer": "identity.json sha256 is not the digest",
    "actual-torch": "sealed execution key",
    "training-mask": "score_training.safetensors active_mask differs from identity.json",
}


@pytest.fixture
def sealed(s0_doc, tmp_path) -> tuple[dict[str, Any], Path, Any]:
    doc = only(copy.deepcopy(s0_doc))
    summary = run_doc(doc, tmp_path)
    record = summary.records[0]
    assert record.result == "pass"
    attempt = Path(summary.experiment_dir, "cases", record.case_id, record.attempt_id)
    assert verify_run(Path(summary.experiment_dir)).exit_code == 0
    return doc, attempt, summary


@pytest.mark.parametrize("kind", sorted(FORGERIES))
def test_a_resealed_forgery_is_named_by_verify_and_rescored_by_resume(
    sealed, tmp_path, kind
) -> None:
    doc, attempt, summary = sealed
    name, forge, resumed = FORGERIES[kind]
    reseal(attempt, name, forge(attempt))
    findings = verify_run(Path(summary.experiment_dir)).findings
    damaged = [f for f in findings if f.status == "damaged"]
    assert damaged and OFFLINE[kind] in (damaged[0].reason or ""), findings
    again = run_doc(copy.deepcopy(doc), tmp_path)
    assert not again.records[0].reused
    new = attempt.parent / again.records[0].attempt_id
    reasons = json.loads((new / "actual.json").read_text())["resume"]["damaged_attempts"]
    assert reasons[0]["attempt_id"] == attempt.name
    assert resumed in reasons[0]["reason"], reasons


def test_a_forged_fallback_with_a_recomputed_key_breaks_the_strict_rule(sealed, tmp_path) -> None:
    doc, attempt, summary = sealed
    name, forge, _ = FORGERIES["materialized-fallback"]
    reseal(attempt, name, forge(attempt), rekey=True)
    damaged = [f for f in verify_run(Path(summary.experiment_dir)).findings if f.reason]
    assert "strict execution refuses rollout:rollout.enforce_eager" in (damaged[0].reason or "")
    assert "sealed execution key" not in (damaged[0].reason or "")
    again = run_doc(copy.deepcopy(doc), tmp_path)
    assert not again.records[0].reused
    assert again.records[0].result == "pass"  # rescored honestly


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("score_training.safetensors", "score_training.safetensors active_mask differs"),
        ("score_rollout.safetensors", "active_mask has not the identity's 7 active tokens"),
    ],
)
def test_a_resealed_judged_mask_is_named_by_verify(
    xconf_cli: Callable[..., tuple[int, str, str]], tmp_path: Path, name: str, said: str
) -> None:
    # A judged dump keeps its token table in score_rollout.safetensors, not in identity.json:
    # a mask edited in either score file and resealed is still named, offline.
    import torch
    from safetensors.torch import save_file

    rollout = -torch.rand(2, 4) - 0.1
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    dump = tmp_path / "step.safetensors"
    save_file(
        {"rollout_log_probs": rollout, "old_log_probs": rollout.clone(), "response_mask": mask},
        str(dump),
    )
    out = tmp_path / "out"
    code, _, err = xconf_cli("judge", str(dump), "--dtype", "float32", "--output-root", str(out))
    assert code == 0, err
    run = out / "judge"
    assert verify_run(run).exit_code == 0
    (attempt,) = [a for c in (run / "cases").iterdir() for a in c.iterdir()]
    tensors = load_file(str(attempt / name))
    # score_training holds no token field of its own: the forger adds one that disagrees
    forged = load_file(str(attempt / "score_rollout.safetensors"))["active_mask"].clone()
    forged[0, 0] = 0
    tensors["active_mask"] = forged
    reseal(attempt, name, save(tensors, metadata={"case_id": "x", "attempt_id": attempt.name}))
    damaged = [f for f in verify_run(run).findings if f.status == "damaged"]
    assert damaged and said in (damaged[0].reason or ""), damaged
