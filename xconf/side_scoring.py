"""One case's two sides scored under the read-only guards, and what the sides ran.

The runner (``xconf/runner.py``) decides whether a case is reused, scored or refused; this
module scores it: both engines built or reused, each side's scorer given a private copy of
the frozen inputs, every guard checked (inputs untouched, echo, embedded tokens, no
optimizer over the model), each side read back after scoring and its knobs' status derived
from the readback.
"""

from __future__ import annotations

import json
import traceback
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from xconf.artifacts.store import read_json
from xconf.case_documents import SideOutcome
from xconf.comparison import ComparisonOutcome, compare, error_outcome, identity_outcome
from xconf.contract.loader import NumericalContract, ResolvedThreshold
from xconf.engine_cache import EngineCache
from xconf.errors import IdentityViolation, XconfError
from xconf.execution_plan import ExecutionCase
from xconf.experiment import Identity
from xconf.knobs import BATCH_SIZE, side_dtype
from xconf.operators.catalog import SIDES, ResolutionPolicy, SemanticOperatorCatalog, Side
from xconf.operators.dispatch import OperatorSession
from xconf.runtime.deadline import case_deadline
from xconf.runtime.guards import (
    check_echo,
    check_embedded,
    check_untouched,
    no_optimizer,
    side_copy,
)
from xconf.runtime.materialization import (
    apply_readback,
    backend_application,
    check_pre_build,
    failed_readback,
    ran_dtypes,
    refusal,
    split_readback,
    strict_violations,
    unreached_applications,
)
from xconf.runtime.protocol import (
    Engine,
    FrozenInputs,
    KnobApplication,
    RuntimeBinding,
    SideBinding,
    SideScore,
)
from xconf.shown_text import bounded


@dataclass(frozen=True)
class SideScoring:
    """What scoring a case needs from its run: engines, operators, the strict rule, the
    contract (the thresholds) and the case's time limit."""

    engines: EngineCache
    catalog: SemanticOperatorCatalog
    policy: ResolutionPolicy
    strict_fallback: bool
    contract: NumericalContract
    case_timeout_s: float | None = None


@dataclass(frozen=True)
class Scored:
    """A side's scores as its engine returned them, before any guard looked at them."""

    side: Side
    score: SideScore


def frozen_inputs(identity: Identity) -> FrozenInputs:
    def tensor(rows: tuple[tuple[int, ...], ...]) -> torch.Tensor:
        return torch.tensor([list(r) for r in rows], dtype=torch.int64)

    return FrozenInputs(
        token_ids=tensor(identity.token_ids),
        selected_token_ids=tensor(identity.selected_token_ids),
        active_mask=tensor(identity.active_mask).bool(),
        attention_mask=tensor(identity.attention_mask).bool(),
        position_ids=tensor(identity.position_ids),
    )


def score_sides(
    scoring: SideScoring,
    session: OperatorSession,
    case: ExecutionCase,
    binding: RuntimeBinding,
    identity: Identity,
    inputs: FrozenInputs,
    reused: Mapping[str, SideOutcome],
) -> Iterator[Scored | SideOutcome]:
    """Build or reuse each side's engine and score it. For each side, yields its scores as
    soon as the engine returns them (a guard that then refuses the side leaves them on
    record: what the side echoed is the finding), then its outcome once every guard and the
    readback are done, so a side that raises leaves the sides before it on record. A side in
    ``reused`` is not scored: its outcome is the one given, its echo checked again. A side
    that strict execution refuses raises after its outcome is yielded."""
    strict = scoring.strict_fallback
    check_pre_build(binding, strict_fallback=strict)
    batch_size = int(case.case.knob_dict()[BATCH_SIZE.path])
    recorded = identity.digest()  # what identity.json records
    for side in SIDES:
        if side in reused:
            session.instantiate(case.operator(side))  # its provenance, as when it scored
            outcome = reused[side]
            yield Scored(side, outcome.score)
            check_echo(side, identity, recorded, outcome.score)
        else:
            side_binding = binding.side(side)
            with no_optimizer(side):
                engine = scoring.engines.get(side_binding, case)
                operator = session.instantiate(case.operator(side))
                given = side_copy(inputs)  # private: in-place writes cannot reach anyone else
                score = engine.score(given, identity, batch_size, operator)
            yield Scored(side, score)
            check_untouched(side, given, inputs)
            check_echo(side, identity, recorded, score)
            outcome = _read_side(engine, side_binding, case, inputs, score)
        yield outcome
        reasons = strict_violations(outcome.applications, strict_fallback=strict)
        if reasons:
            raise refusal(reasons)


@dataclass(frozen=True)
class SidesScored:
    """What scoring a case's sides gave: each side's outcome and scores (a refused side's
    too), the operators' provenance (None when scoring did not finish), the knob records of
    the sides never reached, the verdict (or the error's), and the dtypes it was judged at."""

    outcomes: tuple[SideOutcome, ...]
    scores: Mapping[str, SideScore]
    operator_provenance: tuple[Mapping[str, Any], ...] | None
    unreached: Mapping[str, tuple[KnobApplication, ...]]
    verdict: ComparisonOutcome
    dtypes: tuple[str, str]


def score_case(
    scoring: SideScoring,
    case: ExecutionCase,
    binding: RuntimeBinding,
    identity: Identity,
    inputs: FrozenInputs,
    given: Mapping[str, SideOutcome],
) -> SidesScored:
    """Both sides scored (those in ``given`` taken as they are) and compared; a failing case
    is a verdict, never a crashed sweep."""
    knobs = case.case.knob_dict()
    dtypes = (side_dtype(knobs, "rollout"), side_dtype(knobs, "training"))
    contract = scoring.contract
    threshold = contract.threshold_for(*dtypes)
    outcomes: list[SideOutcome] = []
    scores: dict[str, SideScore] = {}
    operator_provenance = None
    try:
        with case_deadline(scoring.case_timeout_s):
            session = OperatorSession(scoring.catalog, scoring.policy)
            for step in score_sides(scoring, session, case, binding, identity, inputs, given):
                if isinstance(step, SideOutcome):
                    outcomes.append(step)
                else:  # the scores, before the guards: a refused side keeps its echo
                    scores[step.side] = step.score
            operator_provenance = session.provenance()
        # Judged at the threshold of the dtypes the engines ran (read back), which differ
        # from the requested ones only when a dtype fell back without strict execution.
        ran = tuple(a for o in outcomes for a in o.applications)
        dtypes = ran_dtypes(ran, dtypes)
        threshold = contract.threshold_for(*dtypes)
        verdict = compare(
            inputs,
            identity.digest(),
            scores["rollout"],
            scores["training"],
            threshold,
            contract,
            training_kv_cache_allowed=identity.training_kv_cache_allowed,
        )
    # A failing case is a verdict, never a crashed sweep; a runtime's sys.exit() too (it
    # would end the run with exit 0 and the case unscored). A stop signal is no verdict.
    except (Exception, SystemExit) as exc:
        if isinstance(exc, XconfError) and exc.code == "runtime.case_timeout":
            scoring.engines.close()  # a stopped engine may be mid-call: never reuse it
        # Sides the case never reached still say what was requested and materialized.
        reached = {o.side for o in outcomes}
        unreached: dict[str, tuple[KnobApplication, ...]] = {
            side: unreached_applications(binding.side(side), exc)
            for side in SIDES
            if side not in reached
        }
        failed = _failure_verdict(exc, threshold, contract)
        return SidesScored(tuple(outcomes), scores, None, unreached, failed, dtypes)
    return SidesScored(tuple(outcomes), scores, operator_provenance, {}, verdict, dtypes)


def _failure_verdict(
    exc: BaseException, threshold: ResolvedThreshold, contract: NumericalContract
) -> ComparisonOutcome:
    """The verdict of a case that raised: its error (an identity violation's own verdict)."""
    error = (
        exc.to_dict()
        if isinstance(exc, XconfError)
        else {
            "code": "runtime.exception",
            "path": None,
            "message": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc(limit=8),
        }
    )
    # A runtime's message may be megabytes: the sealed attempt keeps its head, tail and
    # length, so it stays within verify's bounds (and quick to seal).
    error = {k: bounded(v) if isinstance(v, str) else v for k, v in error.items()}
    if isinstance(exc, IdentityViolation):
        return identity_outcome(threshold, contract, error)
    return error_outcome(threshold, contract, error)


def _read_side(
    engine: Engine,
    side_binding: SideBinding,
    case: ExecutionCase,
    inputs: FrozenInputs,
    score: SideScore,
) -> SideOutcome:
    """A scored side's outcome: its embedded-token check, its readback and knob records."""
    side, knobs = side_binding.side, case.case.knob_dict()
    # What the model embedded, by its own record; without one, the scorer's echo is all
    # there is (docs/reliability.md lists what rests on the adapter's word).
    tokens = "model record" if check_embedded(side, engine, inputs) else "scorer echo"
    # Read back after scoring: request-lifecycle knobs are only observable then.
    try:
        readback = engine.readback()
    except Exception as exc:  # nothing was read: each knob is an error, with the reason
        readback = failed_readback(side_binding, exc)
    applications = apply_readback(side_binding, readback)
    applications += (backend_application(side, knobs, case.operator(side)),)
    # Everything the engine reported, knob or not (compilation mode, cache sizes, ...), and
    # the values it derived (its vocab layout), recorded apart.
    derived, reported = split_readback(readback)
    return SideOutcome(
        side,
        score,
        applications,
        json.loads(json.dumps(reported, default=str)),
        derived,
        tokens,
    )


def ran_applications(actual: Mapping[str, Any]) -> tuple[KnobApplication, ...]:
    """The actual-stage knob records of both sides, as scored."""
    return tuple(
        KnobApplication(**row) for side in SIDES for row in actual.get("sides", {}).get(side, [])
    )


def confounded_reason(mixed: list[dict[str, Any]]) -> str:
    names = ", ".join(f"{m['side']}:{m['path']} ({m['status']})" for m in mixed)
    return f"confounded: not run as set (not the intervention): {names}"


def stored_dtypes(path: Any, case: ExecutionCase) -> tuple[str, str]:
    """The dtypes a stored attempt's engines ran, from its actual.json knob records."""
    knobs = case.case.knob_dict()
    requested = (side_dtype(knobs, "rollout"), side_dtype(knobs, "training"))
    try:
        return ran_dtypes(ran_applications(read_json(path / "actual.json")), requested)
    except (TypeError, KeyError, AttributeError, XconfError):
        return requested
