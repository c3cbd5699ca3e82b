"""Re-deriving a sealed attempt's records before resume reuses it, and offline in verify.

A seal proves the files are the ones that were sealed, not that they are true: whoever edits
a payload can recompute ``COMPLETE``. So an attempt is checked against what it says itself
(offline, ``xconf verify``) and, before resume reuses it, against what this run derives now:

* the execution key: recomputed from the stored records (:data:`KEY_FIELDS` says where each
  field is stored) it must be the key ``COMPLETE`` seals; a payload edited after sealing
  (a knob's status in materialized.json, a version in actual.json) gives another key;
* identity.json: its inner ``sha256`` must be the digest of its own fields, and on resume
  the whole record must be the frozen identity this run scores now;
* requested.json / materialized.json / actual.json provenance: on resume, equal to what the
  plan, the adapter and this process give now;
* strict execution re-applied to the stored knob records: a fallback, unsupported or
  unobservable critical knob under strict execution can only be ``error``; without strict
  execution the stored "not applied" and "confounded" lists must be the recomputed ones;
* the token fields of both score files and of token_diffs (active mask, token ids) must be
  the identity's own, never only the scorer's echo.

Each problem names the record and the field; none is ever a reason to trust the attempt.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xconf.artifacts.layout import (
    COMPARISON_NAME,
    SCORE_FILES,
    TENSOR_SCHEMA,
    TOKEN_DIFFS_NAME,
    read_json,
)
from xconf.canonical import canonical_digest
from xconf.knobs import KNOBS, ROLLOUT_DTYPE, TRAINING_COMPUTE_DTYPE
from xconf.runtime.protocol import KnobApplication
from xconf.runtime.side_reuse import reuse_problems

# The execution key's fields and the record each is stored in (docs/artifacts.md lists them).
KEY_FIELDS: Mapping[str, str] = {
    "case": "requested.json case_id (the planner's case id)",
    "identity": "identity.json sha256 (the frozen identity's digest)",
    "scoring_mode": "identity.json scoring_mode",
    "strict_execution": "requested.json strict_execution (the experiment's strict_fallback)",
    "materialization": "materialized.json (the adapter's binding: knobs, dtypes, fingerprints)",
    "operators": "requested.json operators (bound backends, options, descriptor fingerprints)",
    "environment": "actual.json environment (xconf, torch, python, the adapter's own)",
    "provenance": "actual.json provenance without inputs (runtime target and options, engine "
    "versions and their distributions, native kernel build, scoring-code digests)",
    "comparison": "comparison.json contract (numerical contract version and fingerprint)",
    "tensors": "the tensor schema of the score files (xconf.tensors.v1)",
}
ID_FIELDS = ("token_ids", "selected_token_ids", "active_mask")
# Results judged from the scores: their token fields must be the identity's.
JUDGED = frozenset({"pass", "fail", "zero_active_tokens"})
# The records the key's fields are read from.
KEY_RECORDS = (
    "requested.json",
    "materialized.json",
    "actual.json",
    "identity.json",
    COMPARISON_NAME,
)


def execution_key(fields: Mapping[str, Any]) -> str:
    """The digest of exactly :data:`KEY_FIELDS`."""
    if set(fields) != set(KEY_FIELDS):
        raise ValueError(f"execution key fields {sorted(fields)} are not {sorted(KEY_FIELDS)}")
    return canonical_digest(dict(fields))


def key_fields_from_records(docs: Mapping[str, Any]) -> dict[str, Any] | str:
    """The execution key's fields as the stored records give them, or what is missing."""
    requested, identity = docs["requested.json"], docs["identity.json"]
    actual, comparison = docs["actual.json"], docs[COMPARISON_NAME]
    provenance = actual.get("provenance")
    operators = requested.get("operators")
    if "strict_execution" not in requested or not isinstance(operators, dict):
        return "requested.json lacks strict_execution or operators (an older format)"
    if not isinstance(provenance, dict) or "environment" not in actual:
        return "actual.json lacks environment or provenance (an older format)"
    return {
        "case": requested.get("case_id"),
        "identity": identity.get("sha256"),
        "scoring_mode": identity.get("scoring_mode"),
        "strict_execution": requested["strict_execution"],
        "materialization": docs["materialized.json"],
        "operators": [operators.get(side) for side in ("rollout", "training")],
        "environment": actual["environment"],
        "provenance": {k: v for k, v in provenance.items() if k != "inputs"},
        "comparison": comparison.get("contract"),
        "tensors": TENSOR_SCHEMA,
    }


@dataclass(frozen=True)
class Current:
    """What this run derives now for one case (resume compares the stored records to it)."""

    requested: Mapping[str, Any]
    materialized: Mapping[str, Any]
    identity: Mapping[str, Any]
    environment: Mapping[str, Any]
    provenance: Mapping[str, Any]  # with ``inputs``


def _differing(stored: Any, now: Mapping[str, Any]) -> list[str]:
    if not isinstance(stored, dict):
        return ["(not an object)"]
    return sorted(k for k in set(stored) | set(now) if stored.get(k) != now.get(k))


def _applications(rows: Any) -> list[KnobApplication]:
    """Stored knob records; a row that is not one is skipped (the key check names it)."""
    found = []
    for row in rows if isinstance(rows, list) else []:
        try:
            if row["path"] in KNOBS:
                found.append(KnobApplication(**row))
        except (KeyError, TypeError):
            continue
    return found


def strict_problems(docs: Mapping[str, Any]) -> list[str]:
    """Strict execution (and the not-applied / confounded rules) re-applied to the records."""
    from xconf.runtime.materialization import confounded, not_applied, strict_violations

    requested, actual = docs["requested.json"], docs["actual.json"]
    comparison = docs[COMPARISON_NAME]
    strict = bool(requested.get("strict_execution", True))
    sides = actual.get("sides") if isinstance(actual.get("sides"), dict) else {}
    materialized = docs["materialized.json"].get("sides") or {}
    planned: list[KnobApplication] = []
    ran: list[KnobApplication] = []
    for side in ("rollout", "training"):
        ran += _applications(sides.get(side))
        bound = materialized.get(side) if isinstance(materialized, dict) else None
        planned += _applications(bound.get("knobs") if isinstance(bound, dict) else None)
    reasons = strict_violations(tuple(planned + ran), strict_fallback=strict)
    result = comparison.get("result")
    if reasons and result not in ("error", "invalid_identity", "invalid_artifact"):
        return [f"strict execution refuses {reasons[0]}, yet the sealed result is {result!r}"]
    if result == "error":
        return []
    judged = result in JUDGED
    declared = frozenset(requested.get("changed") or {})
    intervention = comparison.get("intervention") or {}
    problems = []
    for key, rows in (
        ("not_applied", not_applied(tuple(ran), declared)),
        ("confounded", confounded(tuple(ran), declared)),
    ):
        now = sorted(f"{r['side']}:{r['path']}" for r in rows) if judged else []
        said = intervention.get(key, [])
        stored = sorted(f"{r.get('side')}:{r.get('path')}" for r in said if isinstance(r, dict))
        if now != stored:
            problems.append(
                f"comparison.json intervention.{key} is {stored}, the records give {now}"
            )
    return problems


def _knob_rows(doc: Mapping[str, Any], side: str) -> Any:
    """A side's knob records: materialized.json nests them under ``knobs``, actual.json not."""
    rows = (doc.get("sides") or {}).get(side) if isinstance(doc.get("sides"), dict) else None
    return rows.get("knobs") if isinstance(rows, dict) else rows


def record_consistency(docs: Mapping[str, Any]) -> list[str]:
    """The records of one attempt agree with each other, as the runner wrote them:

    * every knob record (materialized and actual) requests requested.json's value, so an
      attempt of another case cannot be passed off as this one with its ids rewritten;
    * each knob's actual status is the one its readback gives (the rule of
      :func:`~xconf.runtime.materialization.apply_readback`): an engine that read back
      another dtype than was set is a fallback, never ``applied``;
    * comparison.json's dtypes are the ones the engines read back as running (the threshold
      follows what ran), so a looser threshold cannot be claimed for a float32 case.
    """
    from xconf.runtime.materialization import apply_readback, ran_dtypes
    from xconf.runtime.protocol import SideBinding

    requested = docs["requested.json"]
    knobs = requested.get("knobs") if isinstance(requested.get("knobs"), dict) else {}
    problems: list[str] = []
    ran: list[KnobApplication] = []
    for side in ("rollout", "training"):
        planned = _applications(_knob_rows(docs["materialized.json"], side))
        stored = _applications(_knob_rows(docs["actual.json"], side))
        ran += stored
        for name, rows in (("materialized.json", planned), ("actual.json", stored)):
            for row in rows:
                if row.path in knobs and row.requested != knobs[row.path]:
                    problems.append(
                        f"{name} {side}:{row.path} requests {row.requested!r}, "
                        f"requested.json {knobs[row.path]!r}"
                    )
        by_path = {row.path: row for row in planned}
        readback = {r.path: r.actual for r in stored if r.path in by_path and r.status != "error"}
        binding = SideBinding(side, tuple(by_path[p] for p in readback), "", ())  # type: ignore[arg-type]
        for now in apply_readback(binding, readback):
            said = next(r for r in stored if r.path == now.path)
            if said.status != now.status or said.actual != now.actual:
                problems.append(
                    f"actual.json {side}:{now.path} reads back {said.actual!r} with status "
                    f"{said.status!r}; that readback gives {now.status!r}"
                )
    comparison = docs[COMPARISON_NAME]
    dtype_paths = (ROLLOUT_DTYPE.path, TRAINING_COMPUTE_DTYPE.path)
    if comparison.get("result") in JUDGED and set(dtype_paths) <= set(knobs):
        want = ran_dtypes(tuple(ran), (str(knobs[dtype_paths[0]]), str(knobs[dtype_paths[1]])))
        said_dtypes = (comparison.get("rollout_dtype"), comparison.get("training_dtype"))
        if said_dtypes != want:
            problems.append(
                f"comparison.json judges dtypes {list(said_dtypes)}, the engines ran {list(want)}"
            )
    return problems


@dataclass(frozen=True)
class TokenPayload:
    """Where a judged dump's identity keeps its token table: one score file, not JSON.

    ``same_as`` names the fields stored once under another field's name (a verl dump's
    scored tokens are its response tokens: ``selected_token_ids`` is ``token_ids``);
    ``logprobs``, when set, the one file that holds both sides' logprobs (token_diffs: the
    dumped values on the active tokens), so the score files hold none of their own.
    """

    file: str
    shape: list[int]
    active: int
    same_as: Mapping[str, str]
    logprobs: str | None = None

    def stored_name(self, field: str) -> str:
        return self.same_as.get(field, field)


def token_payload(identity: Mapping[str, Any], *, judged: bool) -> TokenPayload | None:
    """The token table identity.json declares when it keeps none of its own and its recipe
    names the score file that holds it (``xconf judge``), else None. ``judged``: the run's
    header says the attempt is a judged dump's; a scored attempt's identity never moves its
    tokens elsewhere, whatever its recipe declares."""
    if not judged or any(identity.get(name) for name in ID_FIELDS):
        return None
    try:
        recipe = identity.get("recipe") or {}
        if isinstance(recipe, str):
            recipe = json.loads(recipe)
        declared = recipe["token_payload"]
        file, shape, active = declared["file"], recipe["shape"], recipe["active_tokens"]
        tensors, same_as = declared["tensors"], declared.get("same_as", {})
        logprobs = declared.get("logprobs")
    except (TypeError, ValueError, KeyError, AttributeError):
        return None
    if file not in SCORE_FILES.values() or not isinstance(active, int):
        return None
    if logprobs not in (None, TOKEN_DIFFS_NAME):
        return None
    if not (isinstance(shape, list) and all(isinstance(n, int) for n in shape)):
        return None
    if not isinstance(tensors, list) or not isinstance(same_as, dict):
        return None
    # every field is stored, or the same as a stored one: none is left unchecked
    if not all(field in tensors or same_as.get(field) in tensors for field in ID_FIELDS):
        return None
    if not set(same_as) <= set(ID_FIELDS) or set(same_as) & set(tensors):
        return None
    return TokenPayload(file, shape, active, dict(same_as), logprobs)


def tensor_problems(path: Path, identity: Mapping[str, Any], *, judged: bool = False) -> list[str]:
    """The stored token fields must be identity.json's own (never only a scorer's echo)."""
    import torch

    from xconf.artifacts.store import read_tensors

    problems = []
    expected = {}
    payload = token_payload(identity, judged=judged)
    reference = None  # the score file the others are checked against, when it is not JSON
    if payload is not None:
        # A judged dump's identity names its tokens by the dump's digest and keeps them in
        # one score file (per-token JSON does not scale): that file holds the one token
        # table, of the shape and active count the identity records; any token field
        # another file also holds must agree with it.
        reference = payload.file
        held = read_tensors(path / reference)
        if not held:
            return [f"{reference} holds no token table (identity.json names it)"]
        for name in ID_FIELDS:
            table = held.get(payload.stored_name(name))
            if table is None or list(table.shape) != payload.shape:
                return [f"{reference} {name} is not of the identity's shape {payload.shape}"]
            expected[name] = table.to(torch.int64)
        if int(expected["active_mask"].sum()) != payload.active:
            active = payload.active
            return [f"{reference} active_mask has not the identity's {active} active tokens"]
    else:
        for name in ID_FIELDS:
            try:
                expected[name] = torch.tensor(identity[name], dtype=torch.int64)
            except (KeyError, TypeError, ValueError, RuntimeError):
                return [f"identity.json {name} is not a token table"]
    files = {**SCORE_FILES, "diffs": TOKEN_DIFFS_NAME}
    for label, name in files.items():
        if name == reference:
            continue  # read once above: it is what the others are compared with
        tensors = read_tensors(path / name)
        if not tensors:
            continue  # nothing was scored on this side (an error or identity verdict)
        for field in ID_FIELDS if label != "diffs" else ("active_mask",):
            stored = tensors.get(field)
            if stored is None and reference is not None and label != "diffs":
                continue  # the one token table is the reference file's
            if stored is None or stored.shape != expected[field].shape:
                problems.append(f"{name} {field} is not of the identity's shape")
            elif not torch.equal(stored.to(torch.int64), expected[field]):
                problems.append(f"{name} {field} differs from identity.json {field}")
    return problems


def layout_problems(docs: Mapping[str, Any], judged: bool) -> list[str]:
    """The attempt has the layout of its kind, which the run's header decides
    (:func:`~xconf.artifacts.layout.judged_run`), never the attempt itself: a scored
    attempt binds both sides' knobs and reads them back; a judged dump observed no engine."""
    materialized, actual = docs["materialized.json"], docs["actual.json"]
    bound, ran = materialized.get("sides"), actual.get("sides")
    scored = (
        isinstance(bound, dict)
        and isinstance(ran, dict)
        and set(bound) == set(ran) == {"rollout", "training"}
        and "dump" not in actual
    )
    if judged and scored:
        return ["the records are a scored attempt's, in a run of judged dumps"]
    if not judged and not scored:
        return [
            "materialized.json and actual.json do not bind and read back both sides: not the "
            "layout of a scored attempt (a judged dump's records in a scored run?)"
        ]
    return []


def record_problems(
    path: Path,
    seal: Mapping[str, Any],
    current: Current | None = None,
    *,
    judged: bool = False,
) -> list[str]:
    """Every way the attempt's records disagree with themselves, its seal, or ``current``.

    ``judged``: the run is one of ``xconf judge``'s (its header says so): no engine was
    observed, so only the identity and the token tensors are checked here; the judged
    records' own rules are :func:`xconf.judge.records.attempt_problems`."""
    try:
        docs = {name: read_json(path / name) for name in KEY_RECORDS}
    except Exception as exc:  # an unreadable record is damage, whatever the parser raised
        return [f"unreadable record: {type(exc).__name__}: {exc}"]
    if not all(isinstance(d, dict) for d in docs.values()):
        return ["a record is not a JSON object"]
    problems: list[str] = layout_problems(docs, judged)
    if problems:
        return problems
    identity = docs["identity.json"]
    inner = {k: v for k, v in identity.items() if k != "sha256"}
    if identity.get("sha256") != canonical_digest(inner):
        problems.append("identity.json sha256 is not the digest of its own fields")
    fields = None if judged else key_fields_from_records(docs)
    if fields is None:
        pass
    elif isinstance(fields, str):
        problems.append(fields)
    else:
        for key in KEY_FIELDS:  # each field is checked on its own, so the problem names it
            if not isinstance(fields[key], dict | list | str | bool):
                problems.append(f"execution key field {key} ({KEY_FIELDS[key]}) is missing")
        if not problems and execution_key(fields) != seal.get("execution_key"):
            problems.append(
                "the stored records do not give the sealed execution key: "
                "requested, materialized, identity or actual.json was edited after sealing"
            )
    if current is not None:
        for name, now in (
            ("identity.json", current.identity),
            ("requested.json", current.requested),
            ("materialized.json", current.materialized),
        ):
            wrong = _differing(docs[name], now)
            if wrong:
                problems.append(f"{name} differs from what this run derives now: {wrong}")
        actual = docs["actual.json"]
        wrong = _differing(actual.get("provenance"), current.provenance)
        wrong += ["environment"] if actual.get("environment") != current.environment else []
        if wrong:
            problems.append(f"actual.json provenance differs from this run's: {wrong}")
    if not judged:
        problems += record_consistency(docs) + strict_problems(docs)
        # a side taken from another attempt: that attempt is sealed and gives the same scores
        problems += reuse_problems(path, docs, str(seal.get("experiment_id")))
    if docs[COMPARISON_NAME].get("result") in JUDGED:
        # (an invalid_identity attempt stores what the side echoed: that is its finding)
        try:
            problems += tensor_problems(path, identity, judged=judged)
        except Exception as exc:
            problems.append(f"unreadable score tensors: {type(exc).__name__}: {exc}")
    return problems
