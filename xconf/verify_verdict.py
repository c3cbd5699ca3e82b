"""Re-judge one sealed attempt from its own tensors: offline for ``xconf verify``, and before
resume reuses an attempt (:func:`rejudge_attempt`).

The verdict, the mismatch mask, the threshold and every diagnostic of ``comparison.json``
(diff percentiles, approx KL, worst token, drift profile) are recomputed from the stored
token-level tensors with the very functions the run used (``xconf.comparison``), then
compared exactly with what the attempt claims. Only bounded JSON and safetensors are read.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from xconf.artifacts.layout import COMPARISON_NAME, JSON_PAYLOADS, SCORE_FILES, TOKEN_DIFFS_NAME
from xconf.artifacts.layout import read_json as read_bounded_json
from xconf.artifacts.store import read_tensors
from xconf.comparison import _diagnostics, finite_document, recompute_result, verdict_threshold
from xconf.contract.loader import load_contract
from xconf.errors import ArtifactError, XconfError
from xconf.runtime.rederive import TokenPayload, token_payload

RECOMPUTABLE = frozenset({"pass", "fail", "zero_active_tokens"})
DIAGNOSTIC_KEYS = ("mismatch_ratio", "diff", "approx_kl", "worst_token", "drift_profile")


@dataclass(frozen=True)
class _StoredInputs:
    """What ``comparison._diagnostics`` reads of the frozen inputs: the scored token ids."""

    selected_token_ids: torch.Tensor


def _equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a, b))


def _as_json(value: Any) -> Any:
    """A value as it reads back from comparison.json (floats round-trip exactly)."""
    return json.loads(json.dumps(value, allow_nan=True))


def check_diagnostics(
    doc: Mapping[str, Any],
    diffs: Mapping[str, torch.Tensor],
    rollout: Mapping[str, torch.Tensor],
    selected: str = "selected_token_ids",
) -> str | None:
    """Recompute the diagnostics of a pass/fail attempt; the first disagreement, or None.

    ``selected``: the name the scored token ids are stored under in the rollout score file
    (a judged dump stores them once, as ``token_ids``: identity.json's recipe says so).
    """
    active = diffs["active_mask"].bool()
    roll, train = diffs["rollout_logprobs"], diffs["training_logprobs"]
    diff = torch.where(active, torch.abs(train - roll), torch.zeros_like(roll))
    if not _equal(diff, diffs["abs_diff"]):
        return "stored abs_diff disagrees with the recomputation"
    ids = rollout.get(selected)
    if ids is None or ids.shape != active.shape:
        return f"{SCORE_FILES['rollout']} has no {selected} of the scored shape"
    count = int(active.sum())
    try:
        diagnostics = _diagnostics(diff, roll, train, active, _StoredInputs(ids))  # type: ignore[arg-type]
    except Exception:  # the runner recorded the same failure instead of the figures
        if isinstance(doc.get("diagnostics_error"), str):
            return None
        raise
    # Stored as the runner stores them: a non-finite figure is null (and named in non_finite).
    expected = finite_document(
        {"mismatch_ratio": int(doc.get("mismatches", -1)) / count, **diagnostics}
    )
    for key in DIAGNOSTIC_KEYS:
        if _as_json(expected[key]) != doc.get(key):
            return f"diagnostic {key!r} in comparison.json disagrees with the recomputation"
    return None


def _check_documents(path: Path, seal: Mapping[str, Any]) -> str | dict[str, Any]:
    """The JSON payloads by name, or the first problem with them."""
    documents = {}
    for name in JSON_PAYLOADS:
        try:
            document = read_bounded_json(path / name)
        except ArtifactError as exc:
            return f"{name}: {exc.message}"
        if not isinstance(document, dict):
            return f"{name} is not a JSON object"
        if name == "requested.json" and document.get("case_id") != seal.get("case_id"):
            return "requested.json names another case"
        documents[name] = document
    return documents


def check_verdict(path: Path, seal: Mapping[str, Any], *, judged: bool = False) -> str | None:
    """Re-judge a sealed attempt from its own tensors; the first disagreement, or None.
    ``judged``: the run's header says it is one of ``xconf judge``'s (where its identity
    keeps the token table: :func:`~xconf.runtime.rederive.token_payload`)."""
    documents = _check_documents(path, seal)
    if isinstance(documents, str):
        return documents
    payload = token_payload(documents["identity.json"], judged=judged)
    try:
        doc = read_bounded_json(path / COMPARISON_NAME)
        diffs = read_tensors(path / TOKEN_DIFFS_NAME)
        scores = {side: read_tensors(path / name) for side, name in SCORE_FILES.items()}
    except Exception as exc:  # any unreadable payload is damage, whatever the parser raised
        return f"unreadable payload: {type(exc).__name__}: {exc}"
    if not isinstance(doc, dict):
        return "comparison.json is not an object"
    result = doc.get("result")
    if result != seal.get("result"):
        return f"comparison.json says {result!r}, COMPLETE says {seal.get('result')!r}"
    if doc.get("case_id") != seal.get("case_id"):
        return "comparison.json names another case"
    if not diffs:
        if result in RECOMPUTABLE:
            return f"result {result!r} but no token-level tensors to recompute it from"
        return None  # error / invalid_identity / invalid_artifact: nothing was compared
    if result not in RECOMPUTABLE:
        return f"result {result!r} but token-level tensors are present"
    try:
        return _check_recomputation(doc, diffs, scores, payload)
    except Exception as exc:  # wrong shapes or dtypes in resealed tensors are damage too
        return f"token_diffs.safetensors is malformed: {type(exc).__name__}: {exc}"


def _check_recomputation(
    doc: Mapping[str, Any],
    diffs: dict[str, torch.Tensor],
    scores: Mapping[str, Mapping[str, torch.Tensor]],
    payload: TokenPayload | None,
) -> str | None:
    result = doc.get("result")
    recomputed, mismatches = recompute_result(diffs)
    active = diffs["active_mask"].bool()
    dtype = diffs["rollout_logprobs"].dtype
    if dtype not in (torch.float32, torch.float64) or any(
        diffs[k].dtype != dtype for k in ("training_logprobs", "abs_diff", "threshold")
    ):
        return "token_diffs.safetensors mixes dtypes (scores, diffs and threshold share one)"
    threshold = float(diffs["threshold"])
    mask = (
        active & (torch.abs(diffs["training_logprobs"] - diffs["rollout_logprobs"]) > threshold)
    ).to(torch.uint8)
    if recomputed != result:
        return f"recomputed verdict {recomputed!r} disagrees with stored {result!r}"
    if mismatches != doc.get("mismatches"):
        return f"recomputed {mismatches} mismatches, comparison.json says {doc.get('mismatches')}"
    if int(active.sum()) != doc.get("active_tokens", 0) and recomputed != "zero_active_tokens":
        return "active token count disagrees with comparison.json"
    if not _equal(mask, diffs["mismatch_mask"]):
        return "stored mismatch_mask disagrees with the recomputation"
    stored_threshold = doc.get("threshold")
    if (
        not isinstance(stored_threshold, float)
        or verdict_threshold(stored_threshold, dtype) != threshold
    ):
        return f"threshold {threshold!r} in tensors, {stored_threshold!r} in comparison.json"
    contract = load_contract()
    named = doc.get("contract") if isinstance(doc.get("contract"), dict) else {}
    if named != contract.identity():
        # Only the contract this package ships can carry a verdict: the threshold of any
        # other (a made-up one, or an older release's) cannot be re-derived here.
        return (
            f"comparison.json's contract {str(named)[:200]} is not the numerical contract this "
            f"package ships ({contract.version}): its threshold cannot be re-derived"
        )
    try:
        expected = contract.threshold_for(
            str(doc.get("rollout_dtype")), str(doc.get("training_dtype"))
        ).value
    except XconfError:
        return "comparison.json names dtypes the contract has no threshold for"
    if verdict_threshold(expected, dtype) != threshold:
        return f"threshold {threshold!r} is not the contract's {expected!r}"
    for side, score in scores.items():
        if "logprobs" not in score and payload is not None and payload.logprobs == TOKEN_DIFFS_NAME:
            continue  # a judged dump's logprobs are stored once, in token_diffs (identity.json)
        try:
            logprobs = score["logprobs"]
        except KeyError:
            return f"{SCORE_FILES[side]} has no logprobs"
        stored = diffs[f"{side}_logprobs"]
        if logprobs.shape != active.shape or not _equal(
            torch.where(active, logprobs, torch.zeros_like(logprobs)), stored
        ):
            return f"{SCORE_FILES[side]} disagrees with token_diffs.safetensors"
    if recomputed == "zero_active_tokens":
        return None
    selected = "selected_token_ids"
    selected = selected if payload is None else payload.stored_name(selected)
    return check_diagnostics(doc, diffs, scores["rollout"], selected)


# -- before resume reuses an attempt ----------------------------------------------------------
# Re-judging a sealed attempt from its stored tensors before resume reuses it.
#
# The seal proves the files are the ones that were sealed; it cannot prove the verdict is
# right, since whoever rewrites a payload can rewrite the seal. So before reuse the attempt goes
# through the same re-judgement as `xconf verify` (verdict, mismatch count and scores recomputed
# from the tensors), and the stored threshold must be the one the contract gives this case's
# dtypes now: any disagreement makes the attempt damaged and the case is scored again.


def rejudge_attempt(
    path: Path, seal: Mapping[str, Any], threshold: float, *, judged: bool = False
) -> str | None:
    """Why the attempt's sealed verdict does not follow from its tensors; None if it does.

    ``threshold`` is the contract's threshold for the case as the runner (or judge)
    resolves it.
    """
    problem = check_verdict(path, seal, judged=judged)
    if problem is not None:
        return problem
    try:
        diffs = read_tensors(path / "token_diffs.safetensors")
    except Exception as exc:  # unreadable is damage, whatever the parser raised
        return f"unreadable token_diffs.safetensors: {type(exc).__name__}: {exc}"
    if not diffs:
        return None  # nothing was compared (identity or artifact verdicts)
    stored = float(diffs["threshold"].to(torch.float32))
    expected = float(torch.tensor(threshold, dtype=torch.float32))
    if stored != expected:
        return f"stored threshold {stored!r} is not the contract's {expected!r} for this case"
    return None
