"""An attempt's typed records and their one writer.

An attempt publishes five documents (requested, materialized, actual, identity and
comparison.json) and three tensor files. The runner (a scored case) and ``xconf judge`` (a
dump) both build them as immutable records: an :class:`AttemptHead` (what the case is
before anything is scored, which derives the execution key from its own records), its
:class:`Actual` (or :class:`ExternalActual`, when another system scored), its
:class:`Comparison` and the score tensors: together its :class:`AttemptPayload` (every
payload file), published through :meth:`AttemptPayload.publish`, the one writer."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from xconf.artifacts.layout import COMPARISON_NAME, SCORE_FILES, TOKEN_DIFFS_NAME
from xconf.artifacts.layout import TENSOR_SCHEMA as TENSOR_SCHEMA  # its owner; re-exported
from xconf.artifacts.store import ExperimentStore, PublishedAttempt
from xconf.comparison import ComparisonOutcome, Intervention, Result
from xconf.errors import ArtifactError
from xconf.execution_plan import ExecutionCase
from xconf.experiment import Identity
from xconf.operators.catalog import SIDES, Side
from xconf.runtime import rederive
from xconf.runtime.protocol import KnobApplication, RuntimeBinding, SideScore
from xconf.runtime.side_reuse import REUSED_FIELD, SideSource, side_key


@dataclass(frozen=True)
class SideOutcome:
    """What scoring one side gave: its scores, its knob records as read back after scoring,
    everything else the engine reported (``reported``) or derived, and where the check of the
    scored tokens came from. A later case of the run may take it whole (``side_reuse``)."""

    side: Side
    score: SideScore
    applications: tuple[KnobApplication, ...]
    reported: Mapping[str, Any]
    derived: Mapping[str, Any]
    tokens_checked_from: str


@dataclass(frozen=True)
class Actual:
    """actual.json: what happened when the case was scored (docs/artifacts.md).

    ``outcomes``: the sides scored (or taken from another attempt, ``reused_from``), in
    order; ``unreached``: the knob records of the sides the case never reached (it failed
    first); ``operator_provenance`` is None when scoring did not finish.
    """

    environment: Mapping[str, str]
    provenance: Mapping[str, Any]
    outcomes: tuple[SideOutcome, ...]
    unreached: Mapping[str, tuple[KnobApplication, ...]] = field(default_factory=dict)
    operator_provenance: tuple[Mapping[str, Any], ...] | None = None
    wall_s: float = 0.0
    damaged_attempts: tuple[Mapping[str, str], ...] = ()
    reused_from: Mapping[str, SideSource] = field(default_factory=dict)

    def applications(self) -> tuple[KnobApplication, ...]:
        """Both sides' knob records, as scored (or as requested, on a side never reached)."""
        by_side = {o.side: o.applications for o in self.outcomes}
        return tuple(a for side in SIDES for a in by_side.get(side, self.unreached.get(side, ())))

    def to_dict(self) -> dict[str, Any]:
        sides: dict[str, tuple[KnobApplication, ...]] = {
            o.side: o.applications for o in self.outcomes
        }
        sides.update({s: rows for s, rows in self.unreached.items() if s not in sides})
        document: dict[str, Any] = {
            "sides": {side: [a.to_dict() for a in rows] for side, rows in sides.items()},
            "environment": dict(self.environment),
            "provenance": dict(self.provenance),
            "wall_s": self.wall_s,
        }
        if self.outcomes:
            document["scored_tokens_checked_from"] = {
                o.side: o.tokens_checked_from for o in self.outcomes
            }
            document["readback"] = {o.side: dict(o.reported) for o in self.outcomes}
            document["derived"] = {o.side: dict(o.derived) for o in self.outcomes}
        if self.operator_provenance is not None:
            document["operator_provenance"] = [dict(p) for p in self.operator_provenance]
        if self.damaged_attempts:
            document["resume"] = {"damaged_attempts": [dict(d) for d in self.damaged_attempts]}
        if self.reused_from:
            document[REUSED_FIELD] = {s: src.to_dict() for s, src in self.reused_from.items()}
        return document


@dataclass(frozen=True)
class Requested:
    """requested.json: what the plan asks of the case, before any engine is built."""

    case_id: str
    knobs: Mapping[str, Any]
    changed: Mapping[str, Any]
    strict_execution: bool | None  # None: a judged dump's (no engine ran under a strict rule)
    operators: Mapping[str, Any]

    @classmethod
    def of(cls, case: ExecutionCase, changed: Mapping[str, Any], strict: bool) -> Requested:
        """A scored case's request: its plan row's knobs, what it changes, its operators."""
        operators: dict[str, Mapping[str, Any]] = {b.side: b.to_dict() for b in case.operators}
        return cls(case.case.case_id, case.case.knob_dict(), dict(changed), strict, operators)

    def to_dict(self) -> dict[str, Any]:
        document = {
            "case_id": self.case_id,
            "knobs": dict(self.knobs),
            "changed": dict(self.changed),
            "strict_execution": self.strict_execution,
            "operators": {
                side: dict(b) if isinstance(b, Mapping) else b for side, b in self.operators.items()
            },
        }
        if self.strict_execution is None:
            del document["strict_execution"]
        return document


@dataclass(frozen=True)
class ExternalSource:
    """materialized.json of logprobs another system computed: what they came from, and that
    no engine of theirs was observed (a judged dump)."""

    runtime_kind: str
    case_id: str
    file: str
    sha256: str
    note: str = "logprobs computed by another system; its engines were not observed"

    def to_dict(self) -> dict[str, Any]:
        return {
            "runtime_kind": self.runtime_kind,
            "case_id": self.case_id,
            "source": {"file": self.file, "sha256": self.sha256},
            "note": self.note,
        }


# materialized.json: the adapter's binding of a scored case (runtime/protocol.py), or the
# source of a judged one.
Materialized = RuntimeBinding | ExternalSource


@dataclass(frozen=True)
class ExternalActual:
    """actual.json of a judged dump: no side was observed; ``observed`` is what xconf read
    of the dump (its file, digest, shape, dtypes and where each came from)."""

    observed: Mapping[str, Any]
    wall_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"sides": {}, "dump": dict(self.observed), "wall_s": self.wall_s}


@dataclass(frozen=True)
class Comparison:
    """comparison.json: the verdict as one case publishes it, its id, the dtypes its
    engines ran (the threshold's), its intervention (a scored case's), and
    ``confounded_reason``, the reason when the verdict has none."""

    verdict: ComparisonOutcome
    case_id: str
    dtypes: tuple[str, str]
    intervention: Intervention | None = None
    confounded_reason: str | None = None

    @property
    def result(self) -> Result:
        return self.verdict.result

    @property
    def token_diffs(self) -> dict[str, torch.Tensor]:
        return self.verdict.token_diffs

    @property
    def document(self) -> dict[str, Any]:
        """comparison.json, as :meth:`to_dict` gives it (a new dict each time)."""
        return self.to_dict()

    def to_dict(self) -> dict[str, Any]:
        document = dict(self.verdict.document)
        if self.intervention is not None:
            document["intervention"] = self.intervention.to_dict()
        document.update(
            case_id=self.case_id, rollout_dtype=self.dtypes[0], training_dtype=self.dtypes[1]
        )
        if self.confounded_reason is not None and document.get("reason") is None:
            document["reason"] = self.confounded_reason
        return document


class AttemptHead(Protocol):
    """An attempt's records before anything is scored (resume compares the stored ones
    with them), and the execution key they give."""

    @property
    def case_id(self) -> str: ...

    def documents(self) -> dict[str, dict[str, Any]]:
        """requested.json, materialized.json, identity.json."""
        ...

    def execution_key(self) -> str: ...


def head_documents(
    requested: Requested, materialized: Materialized, identity: Identity
) -> dict[str, dict[str, Any]]:
    """An attempt head's documents: requested.json, materialized.json and identity.json
    (the frozen identity and its digest)."""
    return {
        "requested.json": requested.to_dict(),
        "materialized.json": materialized.to_dict(),
        "identity.json": {"sha256": identity.digest(), **identity.to_dict()},
    }


@dataclass(frozen=True)
class ScoredHead:
    """A scored case's head: the plan's request, the adapter's binding, the frozen identity,
    and what actual.json will say of this process before scoring (the environment, and the
    provenance with the inputs' digests) and the contract comparison.json will name."""

    requested: Requested
    materialized: RuntimeBinding
    identity: Identity
    environment: Mapping[str, str]
    provenance: Mapping[str, Any]
    contract: Mapping[str, Any]

    @property
    def case_id(self) -> str:
        return self.requested.case_id

    def documents(self) -> dict[str, dict[str, Any]]:
        return head_documents(self.requested, self.materialized, self.identity)

    def _key_records(self) -> dict[str, Any]:
        """The records the key is read from, as this attempt will publish them."""
        return {
            **self.documents(),
            "actual.json": {"environment": self.environment, "provenance": self.provenance},
            COMPARISON_NAME: {"contract": self.contract},
        }

    def execution_key(self) -> str:
        """The digest of :data:`rederive.KEY_FIELDS`, read from this attempt's own records
        (``key_fields_from_records``: the very reading ``xconf verify`` does)."""
        fields = rederive.key_fields_from_records(self._key_records())
        if isinstance(fields, str):  # a head's own records always hold every field
            raise ArtifactError("artifacts.key_fields", fields, "requested.json")
        return rederive.execution_key(fields)

    def side_keys(self) -> dict[str, str | None]:
        """Each side's reuse key (runtime/side_reuse.py), from the same records."""
        records = self._key_records()
        return {side: side_key(records, side) for side in SIDES}

    def current(self) -> rederive.Current:
        """What resume compares a stored attempt's records with."""
        documents = self.documents()
        return rederive.Current(
            requested=documents["requested.json"],
            materialized=documents["materialized.json"],
            identity=documents["identity.json"],
            environment=self.environment,
            provenance=self.provenance,
        )


@dataclass(frozen=True)
class AttemptPayload:
    """Everything one attempt publishes. ``scores``: each score file's tensors by name
    (:func:`score_tensors`; a judged dump's one token table); token_diffs is the
    comparison's."""

    head: AttemptHead
    actual: Actual | ExternalActual
    comparison: Comparison
    scores: Mapping[str, Mapping[str, torch.Tensor]]

    def documents(self) -> dict[str, dict[str, Any]]:
        return {
            **self.head.documents(),
            "actual.json": self.actual.to_dict(),
            COMPARISON_NAME: self.comparison.to_dict(),
        }

    def tensors(self) -> dict[str, Mapping[str, torch.Tensor]]:
        return {**self.scores, TOKEN_DIFFS_NAME: self.comparison.token_diffs}

    def publish(self, store: ExperimentStore) -> PublishedAttempt:
        """The one writer of an attempt: sealed under the key its head derives."""
        return store.publish_attempt(
            self.head.case_id,
            self.head.execution_key(),
            self.documents(),
            self.tensors(),
            self.comparison.result,
        )


def scored_files(scores: Mapping[str, SideScore]) -> dict[str, dict[str, torch.Tensor]]:
    """A scored case's score files (``scores``: every side's scores as its engine returned
    them, a refused side's too; a side never scored has an empty file)."""
    return {SCORE_FILES[side]: score_tensors(scores.get(side)) for side in SIDES}


def score_tensors(score: SideScore | None) -> dict[str, torch.Tensor]:
    if score is None:
        return {}
    return {
        # float64 scores stay float64 (they are judged in float64); the rest are float32.
        "logprobs": (
            score.logprobs if score.logprobs.dtype == torch.float64 else score.logprobs.float()
        ).contiguous(),
        "token_ids": score.scored_token_ids.to(torch.int64).contiguous(),
        "selected_token_ids": score.scored_selected_ids.to(torch.int64).contiguous(),
        "active_mask": score.scored_active_mask.to(torch.uint8).contiguous(),
    }
