"""A side scored once per run: the key that decides its scores, and the re-derivation of a reuse.

Two cases of one run whose side (rollout or training) is configured alike score it alike: a
case that changes only the training side asks the rollout engine for the baseline's scores
again. The runner scores such a side once and later cases take its scores, recording where
they took them from (actual.json ``reused_sides``); ``xconf verify`` and resume re-derive
every such record from the attempts themselves (:func:`reuse_problems`).

A side is reused only when everything that decides its scores is equal, all of it read from
the attempt's own records (:func:`side_key`): the side's whole binding (every knob requested
and materialized, its dtype, distributed context and three fingerprints), both sides'
process fingerprints (a process-wide knob of either side reaches both), the runtime kind and
the side's scorer, the side's bound operator and options, every requested knob that the side
owns or shares (request sizes, the logprob backend), the frozen identity and scoring mode,
strict execution, and the whole environment and provenance (versions, code digests, input
digests). A knob outside the allow-list counts for both sides. Anything unreadable gives no
key, and no key is never equal: the side is scored again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xconf.artifacts.layout import SCORE_FILES, attempt_number, read_json, sha256_file
from xconf.canonical import canonical_digest
from xconf.experiment import is_safe_id
from xconf.knobs import KNOBS

SIDE_NAMES = ("rollout", "training")
# actual.json: where a reusing attempt records, per side, the attempt it took the scores from.
REUSED_FIELD = "reused_sides"
# actual.json fields that hold one entry per side, as the side's scoring produced it: a
# reused side's entries are the source attempt's own.
PER_SIDE_FIELDS = ("sides", "readback", "derived", "scored_tokens_checked_from")
RECORDS = ("requested.json", "materialized.json", "identity.json", "actual.json")
JUDGED = frozenset({"pass", "fail", "zero_active_tokens"})


@dataclass(frozen=True)
class SideSource:
    """The attempt whose side scores a reusing attempt took: its case, attempt, the SHA-256
    its seal names for the side's score file, and the side key both attempts share."""

    case_id: str
    attempt_id: str
    score_sha256: str
    side_key: str

    def to_dict(self) -> dict[str, str]:
        return {
            "case_id": self.case_id,
            "attempt_id": self.attempt_id,
            "score_sha256": self.score_sha256,
            "side_key": self.side_key,
        }


def _owner(path: str) -> str:
    spec = KNOBS.get(path)
    return spec.side if spec is not None else "both"


def side_key(docs: Mapping[str, Any], side: str) -> str | None:
    """The digest of everything in an attempt's records that decides ``side``'s scores; None
    when a record lacks a field (an older or damaged attempt: never reused, never a source)."""
    try:
        requested, materialized = docs["requested.json"], docs["materialized.json"]
        identity, actual = docs["identity.json"], docs["actual.json"]
        sides = materialized["sides"]
        fields = {
            "side": side,
            "identity": identity["sha256"],
            "scoring_mode": identity["scoring_mode"],
            "strict_execution": requested["strict_execution"],
            "runtime_kind": materialized["runtime_kind"],
            "scorer": materialized["scorers"][side],
            "binding": sides[side],
            "processes": [sides[s]["fingerprints"]["process"] for s in SIDE_NAMES],
            "operator": requested["operators"][side],
            "knobs": {
                path: value
                for path, value in requested["knobs"].items()
                if _owner(path) in (side, "both")
            },
            "environment": actual["environment"],
            "provenance": actual["provenance"],
        }
    except (KeyError, TypeError, AttributeError):
        return None
    return canonical_digest(fields)


def _tensor_bytes(path: Path) -> dict[str, tuple[str, tuple[int, ...], bytes]] | str:
    """Each tensor of a score file as dtype, shape and raw bytes: equal means bitwise equal."""
    import torch

    from xconf.artifacts.store import read_tensors

    try:
        tensors = read_tensors(path)
    except Exception as exc:  # unreadable is a problem to report, whatever safetensors raised
        return f"{path.name} is unreadable: {type(exc).__name__}: {exc}"
    return {
        name: (
            str(t.dtype),
            tuple(t.shape),
            t.contiguous().flatten().view(torch.uint8).numpy().tobytes(),
        )
        for name, t in tensors.items()
    }


def _records(path: Path) -> dict[str, Any] | str:
    try:
        docs = {name: read_json(path / name) for name in RECORDS}
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    if not all(isinstance(d, dict) for d in docs.values()):
        return "a record is not a JSON object"
    return docs


def reuse_problems(path: Path, docs: Mapping[str, Any], experiment_id: str) -> list[str]:
    """Every way the reuse records of the attempt at ``path`` fail to re-derive: each names a
    source attempt of this experiment that exists, is sealed, scored the side itself (it is
    the origin of the scores, never a reuse), was judged, has the side key the reusing
    attempt's own records give, seals the score file under the recorded SHA-256, and holds
    the very tensors (dtype, shape, bytes) and per-side records this attempt stores."""
    from xconf.artifacts.seal import Sealed, check_attempt

    actual = docs["actual.json"]
    if REUSED_FIELD not in actual:
        return []
    reused = actual[REUSED_FIELD]
    if not isinstance(reused, dict) or not set(reused) <= set(SIDE_NAMES):
        return [f"actual.json {REUSED_FIELD} is not a record per side"]
    problems: list[str] = []
    for side, record in sorted(reused.items()):
        where = f"actual.json {REUSED_FIELD}.{side}"
        fields = ("case_id", "attempt_id", "score_sha256", "side_key")
        if not isinstance(record, dict) or set(record) != set(fields):
            problems.append(f"{where} does not hold exactly {list(fields)}")
            continue
        if not all(isinstance(record[f], str) for f in fields):
            problems.append(f"{where} holds a field that is not a string")
            continue
        case_id, attempt_id = record["case_id"], record["attempt_id"]
        if not is_safe_id(case_id) or attempt_number(attempt_id) is None:
            problems.append(f"{where} names no attempt ({case_id!r}, {attempt_id!r})")
            continue
        own = side_key(docs, side)
        if own is None or own != record["side_key"]:
            problems.append(f"{where}.side_key is not the key this attempt's records give")
            continue
        source = path.parent.parent / case_id / attempt_id
        if source == path:
            problems.append(f"{where} names this attempt itself")
            continue
        if not source.is_dir():
            problems.append(f"{where}: source attempt {case_id}/{attempt_id} does not exist")
            continue
        state = check_attempt(source, experiment_id, case_id)
        if not isinstance(state, Sealed):
            problems.append(f"{where}: source attempt {case_id}/{attempt_id} is not sealed")
            continue
        source_docs = _records(source)
        if isinstance(source_docs, str):
            problems.append(f"{where}: source records unreadable: {source_docs}")
            continue
        if state.seal.get("result") not in JUDGED:
            problems.append(f"{where}: source attempt was not judged from scores")
            continue
        if side in (source_docs["actual.json"].get(REUSED_FIELD) or {}):
            problems.append(f"{where}: source attempt reused that side itself")
            continue
        if side_key(source_docs, side) != record["side_key"]:
            problems.append(f"{where}: source attempt's records give another side key")
            continue
        name = SCORE_FILES[side]
        if state.seal.get("files", {}).get(name) != record["score_sha256"]:
            problems.append(f"{where}.score_sha256 is not the source's sealed {name}")
            continue
        if sha256_file(source / name) != record["score_sha256"]:
            problems.append(f"{where}: source {name} is not the bytes its seal names")
            continue
        ours, theirs = _tensor_bytes(path / name), _tensor_bytes(source / name)
        if isinstance(ours, str) or isinstance(theirs, str) or ours != theirs:
            problems.append(f"{name} does not hold the source attempt's {side} scores bitwise")
            continue
        for field in PER_SIDE_FIELDS:
            mine = (actual.get(field) or {}).get(side)
            if mine != (source_docs["actual.json"].get(field) or {}).get(side):
                problems.append(f"actual.json {field}.{side} is not the source attempt's")
    return problems
