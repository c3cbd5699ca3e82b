"""Paired execution: bind, reuse or build engines, score both sides, judge, publish, resume."""

from __future__ import annotations

import platform
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch

from xconf.artifacts.layout import SCORE_FILES, sha256_file
from xconf.artifacts.plan_seal import sealed_rows
from xconf.artifacts.store import ExperimentStore, PublishedAttempt, read_json
from xconf.case_documents import (
    Actual,
    AttemptPayload,
    Comparison,
    Requested,
    ScoredHead,
    SideOutcome,
    scored_files,
)
from xconf.case_record import CaseRecord, RunStep, RunSummary
from xconf.comparison import Intervention
from xconf.config.identity import TOKEN_FIELDS
from xconf.contract.loader import NumericalContract, load_contract
from xconf.engine_cache import EngineCache
from xconf.errors import ArtifactError, IdentityViolation, RuntimeMaterializationError
from xconf.execution_plan import ExecutionCase, ExecutionPlan
from xconf.experiment import Identity
from xconf.operators.catalog import ResolutionPolicy, SemanticOperatorCatalog
from xconf.runtime import provenance, rederive
from xconf.runtime.deadline import check_case_timeout
from xconf.runtime.guards import input_digests
from xconf.runtime.machine import this_machine
from xconf.runtime.materialization import confounded, not_applied, with_fingerprints
from xconf.runtime.protocol import FrozenInputs, RuntimeAdapter, RuntimeBinding
from xconf.runtime.ranks import from_rank0, rank, world_size
from xconf.runtime.side_reuse import SideSource
from xconf.side_scoring import (
    SideScoring,
    SidesScored,
    confounded_reason,
    frozen_inputs,
    score_case,
    stored_dtypes,
)
from xconf.verify_verdict import rejudge_attempt

XCONF_VERSION = provenance.XCONF_VERSION
__all__ = ["PairedRunner", "frozen_inputs"]


class PairedRunner:
    def __init__(
        self,
        plan: ExecutionPlan,
        adapter: RuntimeAdapter,
        store: ExperimentStore,
        catalog: SemanticOperatorCatalog,
        policy: ResolutionPolicy,
        *,
        resume: bool = True,
        reuse_sides: bool = True,
        contract: NumericalContract | None = None,
        on_case: Callable[[CaseRecord], None] | None = None,
        case_timeout_s: float | None = None,
        on_step: Callable[[RunStep], None] | None = None,
    ) -> None:
        """``on_case``: told of each finished case; ``on_step``: of each engine built, with
        what it was built for and its seconds (a run's progress, for a log)."""
        self.plan = plan
        self.adapter = adapter
        self.store = store
        self.catalog = catalog
        self.policy = policy
        self.resume = resume
        # A side configured alike in two cases is scored once (xconf/runtime/side_reuse.py).
        self.reuse_sides = reuse_sides
        self._scored: dict[str, _ScoredSide] = {}
        self._kept_rows_bytes = 0  # full-vocabulary rows held in ``_scored``
        self.sides_reused = 0
        self.contract = contract or load_contract()
        self.on_case = on_case
        self.case_timeout_s = check_case_timeout(case_timeout_s)
        self.engines = EngineCache(
            adapter,
            getattr(adapter, "max_cached_engines", 4),
            None if on_step is None else _engine_steps(on_step),
        )
        self._provenance: dict[str, Any] | None = None
        self._env: dict[str, str] | None = None
        self._code: dict[tuple[str, ...], dict[str, str]] = {}
        self._sealed_plan: dict[str, dict[str, Any]] = {}

    # -- identity of an execution -------------------------------------------------------------
    def _environment(self) -> dict[str, str]:
        """Versions of what scores and the machine it runs on, read once per run: each case's
        key and record need them (about 50 ms a lookup of the installed distributions'
        metadata). The machine (CPU model, kernel-picking ISA features) is xconf's own
        reading, after the adapter's: bfloat16 scores differ between CPUs, so an attempt
        sealed on another CPU never resumes here (``runtime/machine.py``)."""
        if self._env is None:
            self._env = {
                "xconf": provenance.xconf_version(),
                "torch": torch.__version__,
                "python": platform.python_version(),
                **provenance.checked_environment(self.adapter),
                **this_machine(),
            }
        return dict(self._env)

    def _bind(self, case: ExecutionCase, identity: Identity) -> RuntimeBinding:
        raw = self.adapter.bind(case, identity)
        if raw.case_id != case.case.case_id:
            raise RuntimeMaterializationError(
                "runtime.bind_mismatch",
                f"the runtime bound case {raw.case_id!r} when asked for {case.case.case_id!r}",
                "runtime._target_",
            )
        kind = self.adapter.runtime_kind
        return replace(
            raw,
            rollout=with_fingerprints(raw.rollout, case.operator("rollout"), kind),
            training=with_fingerprints(raw.training, case.operator("training"), kind),
        )

    def provenance(self, case: ExecutionCase) -> dict[str, Any]:
        """Runtime target and options, the digest of the code that scores this case (runtime
        and its operators' sources), and the engine versions."""
        if self._provenance is None:
            self._provenance = {
                "runtime": provenance.runtime_identity(self.adapter),
                "engines": provenance.engine_versions(),
                "engine_distributions": provenance.engine_distributions(),
            }
        factories = tuple(
            sorted(
                d.factory
                for b in case.operators
                if (d := self.catalog.get(b.semantic_operation, b.backend_id)) is not None
            )
        )
        if factories not in self._code:
            self._code[factories] = provenance.code_digest(self.adapter, factories)
        return {**self._provenance, "code": self._code[factories]}

    def head(
        self, case: ExecutionCase, identity: Identity, binding: RuntimeBinding, inputs: Any
    ) -> ScoredHead:
        """What this run would record for the case before scoring it: its execution key and
        side keys are derived from it, and resume compares the stored records with it."""
        spec = self.plan.plan.spec
        return ScoredHead(
            requested=Requested.of(case, self.changed(case), spec.strict_fallback),
            materialized=binding,
            identity=identity,
            environment=self._environment(),
            provenance={**self.provenance(case), "inputs": input_digests(inputs)},
            contract=self.contract.identity(),
        )

    # -- running ------------------------------------------------------------------------------
    def run(self, case_ids: set[str] | None = None, identity: Identity | None = None) -> RunSummary:
        """``identity``: the frozen identity, when the caller froze it already."""
        started = time.perf_counter()
        spec = self.plan.plan.spec
        # The sealed plan is checked before anything is scored, and it says what each case
        # changed even when this process planned it alone (one job of a sweep).
        self._sealed_plan = sealed_rows(self.store.path)
        if identity is None:
            identity = self.adapter.freeze_identity(spec.identity)
        conflict = self.store.identity_conflict(identity.to_dict())
        if conflict is not None:  # another checkpoint, tokenizer or data set under this id
            raise ArtifactError(
                "artifacts.experiment_conflict",
                f"experiment '{spec.experiment_id}' under {self.store.root} was scored on "
                f"another frozen identity: {conflict}; choose another experiment_id (or "
                "output root)",
                "experiment_id",
            )
        altered = [f for f in TOKEN_FIELDS if getattr(identity, f) != getattr(spec.identity, f)]
        if spec.identity.recipe == "{}" and altered:
            # Declared tokens are frozen as declared (a runtime may pin the checkpoint's digest
            # in its id): scores of other tokens would be this plan's verdicts.
            raise IdentityViolation(
                "identity.altered_by_runtime",
                f"the runtime froze other {', '.join(altered)} than the experiment declares",
                f"identity.{altered[0]}",
            )
        inputs = frozen_inputs(identity)
        summary = RunSummary(spec.experiment_id, str(self.store.path))
        cases = [c for c in self.plan.cases if case_ids is None or c.case.case_id in case_ids]
        bound = [(c, self._bind(c, identity)) for c in cases]
        # Group by rollout construction so each distinct engine is built once.
        order = {b.rollout.reuse_key(): i for i, (_, b) in reversed(list(enumerate(bound)))}
        bound.sort(key=lambda cb: (order[cb[1].rollout.reuse_key()], cb[0].case.index))
        try:
            for case, binding in bound:
                self.store.check_present()  # a deleted run directory stops the run here
                record = self._run_case(case, binding, identity, inputs)
                summary.records.append(record)
                if self.on_case is not None:
                    self.on_case(record)
        finally:
            self.engines.close()
        summary.records.sort(key=lambda r: self.plan.plan.case(r.case_id).index)
        summary.engines_built = self.engines.built
        summary.engines_reused = self.engines.reused
        summary.sides_reused = self.sides_reused
        summary.seconds["total"] = time.perf_counter() - started
        return summary

    def _run_case(
        self, case: ExecutionCase, binding: RuntimeBinding, identity: Identity, inputs: FrozenInputs
    ) -> CaseRecord:
        head = self.head(case, identity, binding, inputs)
        key = head.execution_key()
        current = head.current()
        reused: CaseRecord | None = None
        damaged: list[dict[str, str]] = []
        if self.resume and rank() == 0:

            def judged_again(check: Any) -> bool:
                # A seal proves the bytes are the ones sealed, not that the verdict is right:
                # re-judge from the stored tensors and re-derive the records from this run;
                # any disagreement is damage, and the case is scored again.
                problems = rederive.record_problems(check.path, check.seal, current)
                if not problems:
                    threshold = self._threshold(stored_dtypes(check.path, case)).value
                    problem = rejudge_attempt(check.path, check.seal, threshold)
                    problems = [problem] if problem is not None else []
                if problems:
                    reason = "; ".join(problems)
                    damaged.append({"attempt_id": check.attempt_id, "reason": reason})
                return not problems

            reusable = self.store.find_reusable(case.case.case_id, key, accept=judged_again)
            if reusable is not None:
                document = read_json(reusable.path / "comparison.json")
                reused = _record(case, reusable.attempt_id, document, reused=True)
        # Rank 0 decides reuse for every rank, so all ranks score (and meet in collectives) or none.
        reused = from_rank0(reused)
        if reused is not None:
            return reused
        keys = head.side_keys()
        sides = self._reusable(keys)
        attempt, actual = self._score(case, binding, identity, inputs, head, sides, tuple(damaged))
        record = None
        if rank() == 0:  # one rank publishes; the others scored only to take part in collectives
            published = attempt.publish(self.store)
            self.sides_reused += len(actual.reused_from)
            self._remember(published, actual, keys)
            verdict = attempt.comparison.to_dict()
            record = _record(case, published.attempt_id, verdict, reused=False)
        return from_rank0(record)  # type: ignore[return-value]

    def changed(self, case: ExecutionCase) -> dict[str, Any]:
        """The knobs this case changes against the experiment's baseline, per the sealed plan."""
        row = self._sealed_plan.get(case.case.case_id)
        if row is not None and isinstance(row.get("changed"), dict):
            return dict(row["changed"])
        return dict(case.case.changed)

    def _threshold(self, dtypes: tuple[str, str]) -> Any:
        return self.contract.threshold_for(*dtypes)

    def _reusable(self, keys: Mapping[str, str | None]) -> dict[str, _ScoredSide]:
        """The sides of this case that a case before it in this run scored alike. Only in one
        process: with several ranks every side is scored (each rank holds its own scores)."""
        if not self.reuse_sides or world_size() > 1:
            return {}
        return {
            side: self._scored[key]
            for side, key in keys.items()
            if key is not None and key in self._scored
        }

    def _remember(
        self,
        published: PublishedAttempt,
        actual: Actual,
        keys: Mapping[str, str | None],
    ) -> None:
        """Offer the sides this attempt scored itself to the cases after it (a judged verdict
        only: its scores are what verify re-judges)."""
        if not self.reuse_sides or published.result not in rederive.JUDGED:
            return
        for outcome in actual.outcomes:
            key = keys[outcome.side]
            if outcome.side in actual.reused_from or key is None or key in self._scored:
                continue
            digest = sha256_file(published.path / SCORE_FILES[outcome.side])
            source = SideSource(published.case_id, published.attempt_id, digest, key)
            self._scored[key] = _ScoredSide(self._rows_within_budget(outcome), source)

    def _rows_within_budget(self, outcome: SideOutcome) -> SideOutcome:
        """``outcome`` as the run keeps it for later cases: with its full-vocabulary rows
        while the rows kept so far stay under ``KEPT_ROWS_BYTES`` (the baseline's sides come
        first), else without them (a case that takes it then reports no figures, and why)."""
        rows = outcome.score.vocab_rows
        if rows is None:
            return outcome
        size = rows.numel() * rows.element_size()
        if self._kept_rows_bytes + size <= KEPT_ROWS_BYTES:
            self._kept_rows_bytes += size
            return outcome
        return replace(outcome, score=replace(outcome.score, vocab_rows=None))

    def _score(
        self,
        case: ExecutionCase,
        binding: RuntimeBinding,
        identity: Identity,
        inputs: FrozenInputs,
        head: ScoredHead,
        reused: Mapping[str, _ScoredSide],
        damaged: tuple[dict[str, str], ...],
    ) -> tuple[AttemptPayload, Actual]:
        """The case scored (or its error): the attempt it publishes, and its actual record."""
        case_started = time.perf_counter()
        scoring = SideScoring(
            self.engines,
            self.catalog,
            self.policy,
            self.plan.plan.spec.strict_fallback,
            self.contract,
            self.case_timeout_s,
        )
        given = {side: r.outcome for side, r in reused.items()}
        sides = score_case(scoring, case, binding, identity, inputs, given)
        actual = Actual(
            environment=head.environment,
            provenance=head.provenance,
            outcomes=sides.outcomes,
            unreached=sides.unreached,
            operator_provenance=sides.operator_provenance,
            damaged_attempts=damaged,
            reused_from={o.side: reused[o.side].source for o in sides.outcomes if o.side in reused},
        )
        comparison = self._comparison(case, sides, actual)
        # Engines (re)built and both sides scored; in actual.json (what happened), not in the
        # verdict document, which a rescore must reproduce byte for byte.
        actual = replace(actual, wall_s=time.perf_counter() - case_started)
        return AttemptPayload(head, actual, comparison, scored_files(sides.scores)), actual

    def _comparison(self, case: ExecutionCase, sides: SidesScored, actual: Actual) -> Comparison:
        """The verdict as the case publishes it, with the intervention its knob records say."""
        declared = frozenset(self.changed(case))
        intervention = Intervention(tuple(sorted(declared)))
        if sides.verdict.result in rederive.JUDGED:  # else no numerical verdict: the error says why
            ran = actual.applications()
            intervention = replace(
                intervention,
                not_applied=tuple(not_applied(ran, declared)),
                # A confounded case is not the one-knob case it claims: never evidence either.
                confounded=tuple(confounded(ran, declared)),
            )
        mixed = [dict(r) for r in intervention.confounded]
        reason = confounded_reason(mixed) if mixed else None
        return Comparison(sides.verdict, case.case.case_id, sides.dtypes, intervention, reason)


# The full-vocabulary rows the run keeps for the sides later cases reuse: the two sides of
# the real default's baseline, which the run scores first and one-at-a-time cases reuse
# (2,304 tokens x 49,152 columns of float32: 453 MB a side).
KEPT_ROWS_BYTES = 1 << 30


@dataclass(frozen=True)
class _ScoredSide:
    """A side this run scored, and the sealed attempt that holds its scores."""

    outcome: SideOutcome
    source: SideSource


def _engine_steps(
    on_step: Callable[[RunStep], None],
) -> Callable[[Any, ExecutionCase, float], None]:
    """An engine cache's ``on_build`` that tells ``on_step`` what was built, and for which case."""

    def built(binding: Any, case: ExecutionCase, seconds: float) -> None:
        on_step(RunStep("engine", f"{binding.side} engine built for {case.case.label()}", seconds))

    return built


def _record(
    case: ExecutionCase, attempt_id: str, doc: Mapping[str, Any], *, reused: bool
) -> CaseRecord:
    return CaseRecord.from_comparison(
        doc,
        case_id=case.case.case_id,
        label=case.case.label(),
        kind=case.case.kind,
        attempt_id=attempt_id,
        reused=reused,
    )
