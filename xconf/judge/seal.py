"""`xconf judge`: each dump one case of one experiment, judged and sealed like a scored run.

The verdict is :func:`xconf.comparison.compare` on the dumped tensors (the same rule, the
same contract threshold), and the attempt goes through :class:`ExperimentStore` with the
same payload files, so the verdict table, ``xconf report`` and ``xconf verify`` work on it.
What xconf cannot observe about a dump is recorded, not invented: the scorers' read-only
evidence is the dump file's digest read before and after loading (the file did not change
while it was judged), and ``materialized.json`` says the engines were not observed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch

from xconf.artifacts.layout import JUDGED_LEVEL
from xconf.artifacts.store import AttemptCheck, ExperimentStore, read_json
from xconf.canonical import canonical_json
from xconf.case_documents import (
    AttemptPayload,
    Comparison,
    ExternalActual,
    ExternalSource,
    Requested,
)
from xconf.case_record import CaseRecord, RunSummary
from xconf.comparison import ComparisonOutcome, compare
from xconf.contract.loader import load_contract
from xconf.experiment import PLAN_SCHEMA, Identity, is_safe_id
from xconf.judge.dumps import Dump, JudgeError
from xconf.judge.records import (
    DTYPE_PATHS,
    EXTERNAL,
    JUDGE_VERSION,
    PLAN_KIND,
    RECIPE_KIND,
    RUNTIME_KIND,
    JudgedHead,
    attempt_problems,
    choose_dtype,
    dumps_digest,
)
from xconf.rollout_correction import Correction, rollout_correction
from xconf.runtime.protocol import FrozenInputs, ReadOnlyEvidence, SideScore

__all__ = ["JUDGE_VERSION", "RUNTIME_KIND", "JudgedCase", "judge_cases", "resolve_dtypes"]


@dataclass(frozen=True)
class JudgedCase:
    dump: Dump
    rollout_dtype: str
    training_dtype: str
    correction: Correction | None = None
    # where each dtype came from ("given", "file:dtype", ...): actual.json records it, and
    # verify re-derives the threshold from it (xconf.judge.records.derived_dtypes)
    dtype_sources: tuple[tuple[str, str], ...] = (("rollout", "given"), ("training", "given"))

    @property
    def case_id(self) -> str:
        return self.dump.name


def resolve_dtypes(
    dump: Dump,
    dtype: str | None,
    rollout_dtype: str | None,
    training_dtype: str | None,
    correction: Correction | None = None,
) -> JudgedCase:
    """Command line first, then the file's own ``dtype`` keys; never a silent default."""
    declared = dict(dump.declared)
    chosen = {
        "rollout": choose_dtype("rollout", rollout_dtype or dtype, declared),
        "training": choose_dtype("training", training_dtype or dtype, declared),
    }
    if chosen["rollout"] is None or chosen["training"] is None:
        raise JudgeError(
            "judge.no_dtype",
            "no dtype to pick the threshold: pass --dtype (or --rollout-dtype/--training-dtype) "
            "or store a 'dtype' key in the file",
            dump.path,
        )
    (roll, roll_from), (train, train_from) = chosen["rollout"], chosen["training"]
    contract = load_contract()
    for side, value in (("rollout", roll), ("training", train)):
        if value not in contract.thresholds:
            raise JudgeError(
                "judge.unknown_dtype",
                f"{side} dtype {value!r}; the contract knows {sorted(contract.thresholds)}",
                f"{dump.path}:{side}_dtype",
            )
    if not is_safe_id(dump.name):
        raise JudgeError(
            "judge.bad_case_name",
            f"case name {dump.name!r} is not a safe id ([A-Za-z0-9._-]); use --case NAME=FILE",
            dump.path,
        )
    sources = (("rollout", roll_from), ("training", train_from))
    return JudgedCase(dump, roll, train, correction, sources)


# Each per-token payload of a judged attempt is stored once (xconf.runtime.rederive reads
# this): one token table, where a verl dump's scored tokens are its response tokens
# (selected_token_ids is token_ids), and both sides' logprobs in token_diffs, which holds
# the dumped values on every active token (the verdict's and verify's input).
TOKEN_FILE = "score_rollout.safetensors"
TOKEN_PAYLOAD = {
    "file": TOKEN_FILE,
    "tensors": ["token_ids", "active_mask"],
    "same_as": {"selected_token_ids": "token_ids"},
    "logprobs": "token_diffs.safetensors",
}


def _identity(case: JudgedCase) -> Identity:
    """The judged input, named by the dump's digest; no per-token field is JSON.

    The token ids and the mask a verdict covers are the dump's (its SHA-256 covers every
    byte); the attempt stores them in ``score_*.safetensors``, never in ``identity.json``,
    so the identity stays small at any batch size.
    """
    d = case.dump
    b, t = d.rollout.shape
    return Identity(
        checkpoint_id="external:unknown",
        model_version="external:unknown",
        tokenizer_id="external:unknown",
        tokenizer_policy="verl response layout [B, response_len]; token ids "
        + ("from the dump" if d.responses is not None else "not dumped (zeros)"),
        token_ids=(),
        selected_token_ids=(),
        active_mask=(),
        attention_mask=(),
        position_ids=(),
        pre_update_state="as dumped by the producing system",
        cache_metadata="{}",
        packing_metadata="{}",
        scoring_mode="decode",
        recipe=canonical_json(
            {
                "kind": RECIPE_KIND,
                "file": d.path,
                "sha256": d.sha256,
                "bytes": d.size,
                "keys": asdict(d.keys),
                "shape": [b, t],
                "ragged": d.ragged,
                "active_tokens": int(torch.count_nonzero(d.mask)),
                "token_payload": TOKEN_PAYLOAD,
            },
            allow_nan=False,
        ),
    )


def _inputs(dump: Dump) -> FrozenInputs:
    """The frozen inputs straight from the dump's tensors (no per-token Python objects)."""
    b, t = dump.rollout.shape
    # No token ids dumped: zeros, as one element seen [B, T] times (no [B, T] int64 of them).
    zeros = torch.zeros((), dtype=torch.int64).expand(b, t)
    ids = dump.responses if dump.responses is not None else zeros
    return FrozenInputs(
        token_ids=ids,
        selected_token_ids=ids,  # the scored tokens are the response tokens (one table)
        active_mask=dump.mask,
        attention_mask=dump.mask,
        position_ids=torch.arange(t).expand(b, t),
    )


def _score(case: JudgedCase, side: str, identity: Identity, inputs: FrozenInputs) -> SideScore:
    """A side as dumped. The scorer is the dump: the bytes judged are the bytes digested,
    read once from one open file (``xconf.judge.formats``), so before and after are one."""
    d = case.dump
    return SideScore(
        logprobs=d.side(side),
        scored_token_ids=inputs.token_ids,
        scored_selected_ids=inputs.selected_token_ids,
        scored_active_mask=inputs.active_mask,
        evidence=ReadOnlyEvidence(
            state_digest_before=d.sha256,
            state_digest_after=d.sha256,
            mode_restored=True,
            used_kv_cache=False,
            generated_tokens=False,
        ),
        identity_digest=identity.digest(),
    )


def _plan_row(index: int, case: JudgedCase) -> dict[str, Any]:
    return {
        "case_id": case.case_id,
        "index": index,
        "kind": PLAN_KIND,
        "changed": {"dump": case.dump.name},
        "knobs": {
            DTYPE_PATHS["rollout"]: case.rollout_dtype,
            DTYPE_PATHS["training"]: case.training_dtype,
        },
        "operators": dict(EXTERNAL),
    }


def header(experiment_id: str, cases: Sequence[JudgedCase]) -> dict[str, Any]:
    contract = load_contract()
    return {
        "schema": PLAN_SCHEMA,
        "experiment_id": experiment_id,
        "scenario_id": "judge",
        "scenario": {"level": JUDGED_LEVEL, "device": "external", "tool": JUDGE_VERSION},
        "identity_sha256": dumps_digest({c.case_id: c.dump.sha256 for c in cases}),
        "contract": {"version": contract.version, "sha256": contract.sha256, "source": "xconf"},
    }


def judge_cases(
    store: ExperimentStore, cases: Sequence[JudgedCase], *, resume: bool = True
) -> RunSummary:
    """Publish the plan, then judge and seal every case (a sealed identical one is reused)."""
    started = time.perf_counter()
    contract = load_contract()
    the_header = header(store.experiment_id, cases)
    rows = [_plan_row(i, c) for i, c in enumerate(cases)]
    store.publish_plan(the_header, rows)
    summary = RunSummary(store.experiment_id, str(store.path))
    for index, case in enumerate(cases):
        case_started = time.perf_counter()
        head = _head(case, _identity(case), rows[index], contract.identity())
        accept = _reusable(case, head, the_header, rows[index])
        key = head.execution_key()
        reusable = store.find_reusable(case.case_id, key, accept=accept) if resume else None
        if reusable is not None:
            doc = read_json(reusable.path / "comparison.json")
            summary.records.append(_record(case, reusable.attempt_id, doc, reused=True))
            continue
        # the dump was read for this case alone: its tensors are the verdict's to reuse
        rollout, training, comparison = verdict(case, head.identity, owned=True)
        actual = ExternalActual(observed(case), time.perf_counter() - case_started)
        record = AttemptPayload(head, actual, comparison, score_files(rollout, training))
        published = record.publish(store)
        summary.records.append(
            _record(case, published.attempt_id, comparison.to_dict(), reused=False)
        )
    summary.seconds["total"] = time.perf_counter() - started
    return summary


def _reusable(
    case: JudgedCase, head: JudgedHead, run_header: dict[str, Any], row: dict[str, Any]
) -> Any:
    """Resume's test of a sealed attempt with this case's key: its records re-derived
    (:func:`xconf.judge.records.attempt_problems`) and equal to what this run derives now,
    and its verdict re-judged from its tensors at the contract's threshold for the case."""
    from xconf.verify_verdict import rejudge_attempt

    expected = json.loads(json.dumps(head.documents()))
    dump = json.loads(json.dumps(observed(case)))  # actual.json dump, as it reads back
    threshold = load_contract().threshold_for(case.rollout_dtype, case.training_dtype).value

    def accept(check: AttemptCheck) -> bool:
        seal = check.seal or {}
        if attempt_problems(check.path, seal, run_header, row):
            return False
        for name in ("requested.json", "materialized.json", "identity.json"):
            if read_json(check.path / name) != expected[name]:
                return False
        stored = dict(read_json(check.path / "actual.json").get("dump") or {})
        if stored != dump:
            return False
        return rejudge_attempt(check.path, seal, threshold, judged=True) is None

    return accept


def score_files(rollout: SideScore, training: SideScore) -> dict[str, dict[str, torch.Tensor]]:
    """The score files of a judged attempt (:data:`TOKEN_PAYLOAD`): the one token table, and
    no logprobs (token_diffs holds them). Token ids are stored as int32 when every one fits
    (a vocabulary below 2**31), so the table costs 5 bytes a token, not 25."""
    del training  # its logprobs, like the rollout's, are token_diffs' alone
    ids = rollout.scored_token_ids
    narrow = ids.numel() == 0 or int(ids.max()) <= torch.iinfo(torch.int32).max
    table = {
        "token_ids": ids.to(torch.int32 if narrow else torch.int64).contiguous(),
        "active_mask": rollout.scored_active_mask.to(torch.uint8).contiguous(),
    }
    return {TOKEN_FILE: table, "score_training.safetensors": {}}


def verdict(
    case: JudgedCase, identity: Identity | None = None, *, owned: bool = False
) -> tuple[SideScore, SideScore, Comparison]:
    """One dump's verdict and figures, written nowhere: ``judge_cases`` seals it, and
    ``xconf.judge_batch`` (inside a training loop) returns it. ``owned``: the dump's
    tensors may be reused for the token diffs (never a training loop's own tensors)."""
    contract = load_contract()
    identity = identity if identity is not None else _identity(case)
    inputs = _inputs(case.dump)
    threshold = contract.threshold_for(case.rollout_dtype, case.training_dtype)
    d = case.dump
    # Reused only when nothing reads the dump's own tensors after the verdict (verl's
    # figures in the dumped dtypes read them again: _figures_in_dumped_dtype).
    owned = owned and d.rollout.dtype == d.training.dtype == d.verdict_dtype
    rollout = _score(case, "rollout", identity, inputs)
    training = _score(case, "training", identity, inputs)
    outcome = compare(
        inputs,
        identity.digest(),
        rollout,
        training,
        threshold,
        contract,
        correction=case.correction,
        owned=owned,
    )
    outcome = _figures_in_dumped_dtype(case, outcome)
    dtypes = (case.rollout_dtype, case.training_dtype)
    return rollout, training, Comparison(outcome, case.case_id, dtypes)


def _figures_in_dumped_dtype(case: JudgedCase, outcome: ComparisonOutcome) -> ComparisonOutcome:
    """verl computes its figures in the tensors' dtype: a bfloat16 or float16 dump (judged in
    float32) gets them recomputed from the dumped tensors, as verl would log them."""
    d = case.dump
    if (
        "rollout_correction" not in outcome.document
        or d.rollout.dtype == d.training.dtype == d.verdict_dtype
    ):
        return outcome
    figures = rollout_correction(d.rollout, d.training, d.mask, correction=case.correction)
    return replace(outcome, document={**outcome.document, "rollout_correction": figures})


def _head(
    case: JudgedCase, identity: Identity, row: dict[str, Any], contract: dict[str, Any]
) -> JudgedHead:
    """The judged attempt's records before its verdict (its key derives from them)."""
    d = case.dump
    requested = Requested(case.case_id, row["knobs"], row["changed"], None, row["operators"])
    return JudgedHead(
        requested=requested,
        materialized=ExternalSource(RUNTIME_KIND, case.case_id, d.path, d.sha256),
        identity=identity,
        dtypes=(case.rollout_dtype, case.training_dtype),
        contract=contract,
        correction=case.correction.to_dict() if case.correction else None,
    )


def observed(case: JudgedCase) -> dict[str, Any]:
    """actual.json ``dump``: what xconf read of the dump and where each dtype came from."""
    d = case.dump
    return {
        "file": d.path,
        "sha256": d.sha256,
        "bytes": d.size,
        "shape": list(d.rollout.shape),
        "ragged": d.ragged,
        "source_dtypes": dict(d.source_dtypes),
        "verdict_dtype": str(d.verdict_dtype).removeprefix("torch."),
        "declared": dict(d.declared),
        "dtypes": {"rollout": case.rollout_dtype, "training": case.training_dtype},
        "dtype_sources": dict(case.dtype_sources),
        "correction": case.correction.to_dict() if case.correction else None,
        "token_ids": d.responses is not None,
    }


def _record(case: JudgedCase, attempt_id: str, doc: dict[str, Any], *, reused: bool) -> CaseRecord:
    return CaseRecord.from_comparison(
        doc,
        case_id=case.case_id,
        label=f"dump={case.dump.name} ({case.rollout_dtype}/{case.training_dtype})",
        kind="judged",
        attempt_id=attempt_id,
        reused=reused,
    )
