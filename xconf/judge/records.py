"""A judged attempt's records, re-derived: what ``xconf verify`` and a judge resume believe.

A seal proves the files are the ones sealed, not that they are true: whoever edits a record
can reseal it. So a judged attempt (``xconf judge``, :mod:`xconf.judge.seal`) is checked as
strictly as a scored one (:mod:`xconf.runtime.rederive`), by rules of its own, since no
engine was observed:

* its kind is the run's (``experiment.json``: :func:`~xconf.artifacts.layout.judged_run`),
  and its records have that kind's layout (a scored attempt dressed as a dump, or a dump's
  records in a scored run, is damage);
* every record names the seal's case; the identity's recipe, ``actual.json`` and
  ``materialized.json`` name one dump digest, and the run's header binds each case to its
  dump (:func:`binding_problem`): an attempt of one dump copied into another case, its ids
  rewritten, no longer verifies as that case's answer;
* the dtypes that pick the threshold are re-derived from ``actual.json``'s record of where
  each came from (given on the command line or by the caller, or the file's own ``dtype`` /
  ``rollout_dtype`` / ``training_dtype`` key, which must say so: :func:`choose_dtype`, the
  one precedence rule); ``comparison.json``, ``requested.json`` and the plan row must judge
  exactly those, so a float32 fail relabelled bfloat16 is named;
* the execution key is recomputed from the records (:func:`execution_key`);
* when the dump itself is still where the attempt says, with the digest it sealed, the dtype
  keys it declares must be the ones ``actual.json`` records (:func:`dump_problem`): a
  forgery that rewrote every record consistently is still named by the dump it cites.

Only bounded JSON is read here, and the dump through judge's own reader (the tensors are
re-judged by :mod:`xconf.verify_verdict`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xconf.artifacts.layout import COMPARISON_NAME, TENSOR_SCHEMA, read_json
from xconf.canonical import canonical_digest
from xconf.case_documents import ExternalSource, Requested, head_documents
from xconf.experiment import Identity
from xconf.knobs import ROLLOUT_DTYPE, TRAINING_COMPUTE_DTYPE

# v2: read once (digest of the bytes judged), float64 dumps judged in float64, per-token
# payloads in safetensors only, verl's figures in the dumped dtype. v3: every per-token
# payload once: one token table (score_rollout.safetensors; token ids int32 when they fit),
# the logprobs in token_diffs alone. v4: actual.json records where each dtype came from
# and the IS/RS correction, so verify re-derives the threshold and the key from them.
JUDGE_VERSION = "xconf-judge.v4"
RUNTIME_KIND = "judge"
RECIPE_KIND = "judge"
PLAN_KIND = "judged"
EXTERNAL = {"rollout": "external", "training": "external"}
SIDES = ("rollout", "training")
DTYPE_PATHS = {"rollout": ROLLOUT_DTYPE.path, "training": TRAINING_COMPUTE_DTYPE.path}
GIVEN = "given"  # a dtype given on the command line (or by the in-loop caller)
_RECORDS = ("requested.json", "materialized.json", "actual.json", "identity.json", COMPARISON_NAME)


def choose_dtype(
    side: str, given: str | None, declared: Mapping[str, Any]
) -> tuple[str, str] | None:
    """A side's dtype and its source: given first, then the file's ``<side>_dtype``, then its
    ``dtype``; None when nothing names one (judge never defaults)."""
    if given is not None:
        return given, GIVEN
    for key in (f"{side}_dtype", "dtype"):
        value = declared.get(key)
        if isinstance(value, str):
            return value, f"file:{key}"
    return None


def execution_key(
    case_id: Any,
    identity_digest: Any,
    dump_sha256: Any,
    dtypes: Any,
    contract: Any,
    correction: Any,
) -> str:
    """The key a judged attempt is sealed (and reused) under."""
    return canonical_digest(
        {
            "case": case_id,
            "identity": identity_digest,
            "dump": dump_sha256,
            "dtypes": list(dtypes),
            "comparison": contract,
            "tensors": TENSOR_SCHEMA,
            "judge": JUDGE_VERSION,
            "correction": correction,
        }
    )


@dataclass(frozen=True)
class JudgedHead:
    """A judged attempt's records before the verdict (``case_documents.AttemptHead``): the
    dump's case, its source, the identity named by its digest, and what its key adds: the
    dtypes judged, the contract, the IS/RS correction."""

    requested: Requested
    materialized: ExternalSource
    identity: Identity
    dtypes: tuple[str, str]
    contract: Mapping[str, Any]
    correction: Mapping[str, Any] | None

    @property
    def case_id(self) -> str:
        return self.requested.case_id

    def documents(self) -> dict[str, dict[str, Any]]:
        return head_documents(self.requested, self.materialized, self.identity)

    def execution_key(self) -> str:
        """:func:`execution_key` of this attempt's own records."""
        return execution_key(
            self.case_id,
            self.identity.digest(),
            self.materialized.sha256,
            self.dtypes,
            self.contract,
            self.correction,
        )


def dumps_digest(dumps: Mapping[str, str]) -> str:
    """experiment.json's ``identity_sha256`` of a judge run: each case bound to its dump."""
    return canonical_digest(dict(dumps))


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def derived_dtypes(dump: Mapping[str, Any]) -> tuple[str, str] | str:
    """The (rollout, training) dtypes ``actual.json``'s dump record proves, or the problem.

    A dtype from the file must be the one the file's declared keys give by the precedence
    of :func:`choose_dtype`; one given on the command line is what was recorded. An attempt
    of xconf-judge.v3 or older recorded no sources: the file's keys alone prove its dtypes.
    """
    dtypes, sources = dump.get("dtypes"), dump.get("dtype_sources")
    declared = _mapping(dump.get("declared"))
    recorded = isinstance(dtypes, dict) and isinstance(sources, dict)
    out = []
    for side in SIDES:
        value = _mapping(dtypes).get(side) if recorded else None
        source = _mapping(sources).get(side) if recorded else None
        chosen = choose_dtype(side, value if source == GIVEN else None, declared)
        if chosen is None:
            return f"actual.json proves no {side} dtype (none given, none declared by the dump)"
        if recorded and chosen != (value, source):
            return (
                f"actual.json records the {side} dtype {value!r} from {source!r}; the dump's "
                f"declared keys {declared} give {chosen[0]!r} from {chosen[1]!r}"
            )
        out.append(chosen[0])
    return out[0], out[1]


def dump_problem(dump: Mapping[str, Any]) -> str | None:
    """The dump at the path the attempt records, when it is still the sealed one (its
    digest), must declare the dtype keys ``actual.json`` says it declared. Gone or changed:
    nothing to compare (None)."""
    from xconf.judge.formats import META_KEYS, JudgeError, parse_dump

    file = dump.get("file")
    if not isinstance(file, str) or not Path(file).is_file():
        return None
    try:
        parsed = parse_dump(Path(file), set())
    except JudgeError:
        return None  # unreadable now: it is not the dump that was sealed
    if parsed.sha256 != dump.get("sha256"):
        return None
    declared = {k: parsed.meta[k] for k in META_KEYS if k in parsed.meta}
    if declared != _mapping(dump.get("declared")):
        return (
            f"the dump {file} (the sealed sha256) declares {declared}; actual.json records "
            f"{dump.get('declared')}"
        )
    return None


def _recipe(identity: Mapping[str, Any]) -> dict[str, Any]:
    recipe = identity.get("recipe")
    if isinstance(recipe, str):
        try:
            recipe = json.loads(recipe)
        except ValueError:
            return {}
    return _mapping(recipe)


def _correction(actual_dump: Mapping[str, Any], comparison: Mapping[str, Any]) -> Any:
    if "correction" in actual_dump:
        return actual_dump["correction"]
    return _mapping(comparison.get("rollout_correction")).get("correction")


def record_problems(
    docs: Mapping[str, dict[str, Any]],
    seal: Mapping[str, Any],
    header: Mapping[str, Any],
    row: Mapping[str, Any] | None,
) -> list[str]:
    """How a judged attempt's records (``docs``: its JSON records by name) disagree with
    each other, its seal, the run's header and its case's plan row."""
    requested, materialized = docs["requested.json"], docs["materialized.json"]
    actual, comparison = docs["actual.json"], docs[COMPARISON_NAME]
    identity = docs["identity.json"]
    dump, recipe = _mapping(actual.get("dump")), _recipe(identity)
    case = seal.get("case_id")
    if (
        materialized.get("runtime_kind") != RUNTIME_KIND
        or not dump
        or recipe.get("kind") != RECIPE_KIND
    ):
        return ["the records are not a judged dump's (materialized runtime_kind, actual.json "
                "dump, identity recipe kind)"]  # fmt: skip
    problems = []
    for name, doc in (("materialized.json", materialized), (COMPARISON_NAME, comparison)):
        if doc.get("case_id") != case:
            problems.append(f"{name} names case {doc.get('case_id')!r}, COMPLETE {case!r}")
    if requested.get("changed") != {"dump": case} or requested.get("operators") != EXTERNAL:
        problems.append(f"requested.json does not describe the dump of case {case!r}")
    digests = {
        "identity.json recipe": recipe.get("sha256"),
        "actual.json dump": dump.get("sha256"),
        "materialized.json source": _mapping(materialized.get("source")).get("sha256"),
    }
    if len({json.dumps(v) for v in digests.values()}) != 1 or not isinstance(
        digests["actual.json dump"], str
    ):
        problems.append(f"the records name different dumps: {digests}")
    problem = dump_problem(dump)
    if problem is not None:
        problems.append(problem)
    dtypes = derived_dtypes(dump)
    if isinstance(dtypes, str):
        problems.append(dtypes)
    else:
        said = (comparison.get("rollout_dtype"), comparison.get("training_dtype"))
        if said != dtypes:
            problems.append(
                f"comparison.json judges dtypes {list(said)}, actual.json proves {list(dtypes)}"
            )
        knobs = {DTYPE_PATHS[side]: dtype for side, dtype in zip(SIDES, dtypes, strict=True)}
        if requested.get("knobs") != knobs:
            problems.append(f"requested.json knobs {requested.get('knobs')} are not {knobs}")
        scenario = _mapping(header.get("scenario"))
        if scenario.get("tool") == JUDGE_VERSION:
            key = execution_key(
                case,
                identity.get("sha256"),
                dump.get("sha256"),
                dtypes,
                comparison.get("contract"),
                _correction(dump, comparison),
            )
            if key != seal.get("execution_key"):
                problems.append(
                    "the stored records do not give the sealed execution key: "
                    "requested, identity, actual or comparison.json was edited after sealing"
                )
    contract, judged = _mapping(header.get("contract")), _mapping(comparison.get("contract"))
    for key in ("version", "sha256"):
        if judged.get(key) != contract.get(key):
            problems.append(
                f"comparison.json contract {key} {judged.get(key)!r} is not experiment.json's "
                f"{contract.get(key)!r}"
            )
    if row is not None:
        planned = {k: row.get(k) for k in ("knobs", "changed", "operators")}
        stored = {k: requested.get(k) for k in planned}
        if row.get("kind") != PLAN_KIND or planned != stored:
            problems.append(
                f"requested.json differs from the case's row in plan.jsonl: {stored} vs {planned}"
            )
    return problems


def attempt_problems(
    path: Path,
    seal: Mapping[str, Any],
    header: Mapping[str, Any],
    row: Mapping[str, Any] | None,
) -> list[str]:
    """Every check of a judged attempt's records: the identity and token tensors
    (:func:`xconf.runtime.rederive.record_problems`), then :func:`record_problems`."""
    from xconf.runtime.rederive import record_problems as shared_problems

    problems = shared_problems(path, seal, judged=True)
    if problems:
        return problems
    try:
        docs = {name: read_json(path / name) for name in _RECORDS}
    except Exception as exc:  # an unreadable record is damage, whatever the parser raised
        return [f"unreadable record: {type(exc).__name__}: {exc}"]
    return record_problems(docs, seal, header, row)


def attempt_dump(path: Path) -> str | None:
    """The dump digest a judged attempt names (checked by :func:`record_problems`)."""
    try:
        value = _mapping(read_json(path / "actual.json")).get("dump")
    except Exception:
        return None
    sha = _mapping(value).get("sha256")
    return sha if isinstance(sha, str) else None


def binding_problem(
    header: Mapping[str, Any], planned: set[str], dumps: Mapping[str, set[str]]
) -> str | None:
    """``dumps``: the dump digests each case's valid judged attempts name. experiment.json's
    ``identity_sha256`` binds every planned case to one dump: an attempt of another case's
    dump (copied in, its ids rewritten) breaks the binding."""
    split = sorted(case for case, found in dumps.items() if len(found) > 1)
    if split:
        return f"case(s) {split} hold attempts of different dumps"
    if set(dumps) != planned:
        return None  # an incomplete run (verify says so): the binding is checked when whole
    bound = {case: next(iter(found)) for case, found in dumps.items()}
    if dumps_digest(bound) != header.get("identity_sha256"):
        return (
            "experiment.json binds the cases to other dumps than their attempts judged: "
            "an attempt was moved into another case"
        )
    return None
