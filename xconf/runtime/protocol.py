"""The runtime adapter protocol: requested -> materialized -> actual, per knob and side.

An adapter turns an ExecutionCase into a RuntimeBinding (pure: no engine is built), builds
engines for a side on request, and its engines score frozen tokens read-only. The core runner
only sees these backend-neutral records, so adding a runtime never adds a branch to the
planner or runner.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeAlias, runtime_checkable

from xconf.experiment import Identity
from xconf.knobs import KNOBS, KnobSpec, KnobValue, Lifecycle
from xconf.operators.catalog import Side

if TYPE_CHECKING:
    import torch

    from xconf.execution_plan import ExecutionCase
    from xconf.ops.logprob.contract import ShardingSpec

KnobStatus = Literal["applied", "fallback", "unsupported", "unobservable", "error"]
# selected_logprob implementation: (logits [N, V], targets [N], active [N]) -> fp32 [N]
SelectedLogprobOp = Callable[["torch.Tensor", "torch.Tensor", "torch.Tensor"], "torch.Tensor"]


@dataclass(frozen=True)
class ReadbackFailure:
    """A value the live engine could not be read for: reading it raised. A knob read back as
    this is status ``error`` (with the reason), never applied, fallback or unobservable."""

    reason: str

    def __str__(self) -> str:
        return f"readback failed: {self.reason}"


# A readback value: a knob's live value, a derived vocab layout (``*.vocab_layout``, recorded
# in actual.json's ``derived``), a failed read, or None (the engine does not expose it).
ReadbackValue: TypeAlias = "KnobValue | ShardingSpec | ReadbackFailure | None"


@dataclass(frozen=True)
class KnobApplication:
    """One knob on one side through the three stages, with the evidence for its status."""

    path: str
    side: Side
    lifecycle: Lifecycle
    requested: KnobValue
    materialized: KnobValue | None
    actual: KnobValue | None
    status: KnobStatus
    evidence: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "side": self.side,
            "lifecycle": self.lifecycle,
            "requested": self.requested,
            "materialized": self.materialized,
            "actual": self.actual,
            "status": self.status,
            "evidence": self.evidence,
        }


def planned_application(
    path: str,
    side: Side,
    requested: KnobValue,
    materialized: KnobValue | None,
    status: KnobStatus,
    evidence: str,
) -> KnobApplication:
    """The materialized stage of one knob; the actual stage comes from engine readback."""
    return KnobApplication(
        path, side, KNOBS[path].lifecycle, requested, materialized, None, status, evidence
    )


def applied_application(path: str, side: Side, value: KnobValue, evidence: str) -> KnobApplication:
    """A knob materialized exactly as requested (the engine's readback then confirms it)."""
    return planned_application(path, side, value, value, "applied", evidence)


def unsupported_application(
    path: str, side: Side, requested: KnobValue, why: str
) -> KnobApplication:
    """A knob this runtime cannot honour: nothing is materialized, ``why`` is the evidence."""
    return planned_application(path, side, requested, None, "unsupported", why)


class TensorParallelRule(Protocol):
    """How far a checkpoint splits over tensor-parallel ranks, as the model's facts say
    (``adapters/models/facts.ModelFacts``)."""

    @property
    def tp_sizes(self) -> tuple[int, ...]: ...

    def tp_reason(self, tp: int) -> str | None:
        """Why the model cannot be split over ``tp`` ranks (None: it can)."""
        ...


@dataclass(frozen=True)
class RuntimeView:
    """What a runtime's handlers may read of the runtime binding a case: its kind, its
    device, its rollout side and, for a runtime that binds against a frozen checkpoint, the
    checkpoint's tensor-parallel rule (None: no checkpoint frozen, or none that the handlers
    read)."""

    runtime_kind: str
    device: str
    model: TensorParallelRule | None = None
    # The rollout side's package name (``vllm``, ``hf``): a training handler whose knob
    # mirrors the rollout engine's kernels (the arms) reads which engine that is.
    rollout_side: str | None = None


@dataclass(frozen=True)
class KnobRequest:
    """One requested knob value on one side, as a runtime's handler receives it."""

    spec: KnobSpec
    side: Side
    value: KnobValue
    knobs: Mapping[str, KnobValue]  # all the case's knob values (a policy needs FSDP2)
    runtime: RuntimeView  # the runtime binding the case, as its handlers may read it

    @property
    def path(self) -> str:
        return self.spec.path

    def applied(self, evidence: str) -> KnobApplication:
        return applied_application(self.path, self.side, self.value, evidence)

    def applied_as(self, materialized: KnobValue, evidence: str) -> KnobApplication:
        """Applied, with the value the runtime configures for the request (``native`` ->
        ``sdpa``)."""
        return planned_application(
            self.path, self.side, self.value, materialized, "applied", evidence
        )

    def unsupported(self, why: str) -> KnobApplication:
        return unsupported_application(self.path, self.side, self.value, why)


# The materialized value of a knob the handler honours, or ``unsupported`` with the reason.
Materialize = Callable[[KnobRequest], KnobApplication]
# A knob's live value, read from the live state the runtime's engine exposes (each runtime's
# own record: vLLM's resolved config and workers, a scorer's model and forwards); typed by
# each runtime's readback functions, which know their engine's state.
ReadBack = Callable[[Any], "ReadbackValue"]


@dataclass(frozen=True)
class KnobHandler:
    """How one runtime honours one knob, in its three stages.

    ``materialize`` turns the request into its record (``applied`` with the value the engine
    will be built with, or ``unsupported`` with the reason); the materialized value is then
    applied to the side's settings, in the field ``settings.setting_name`` names
    (``runtime/materialization.settings_for``), which the engine is built from; ``readback``
    reads the knob's live value from the state the built engine exposes (``knob_readback``).
    None: the engine has no reading of the knob, which is then ``unobservable``. A knob a
    runtime declares no handler for is ``unsupported``.
    """

    materialize: Materialize
    readback: ReadBack | None = None

    def reading(self, readback: ReadBack | None) -> KnobHandler:
        """This handler, reading the knob back with ``readback`` (a runtime's own engine)."""
        return KnobHandler(self.materialize, readback)


# A runtime's handlers, by knob path (``HANDLERS[ROLLOUT_DTYPE.path]``).
Handlers: TypeAlias = Mapping[str, KnobHandler]


class ServedRequests(Protocol):
    """What an engine's live state says of the requests it answered (``batch.size``)."""

    @property
    def request_sizes(self) -> tuple[int, ...]:
        """Samples per request the engine answered, in order."""
        ...

    @property
    def requested_batch_size(self) -> int | None:
        """The batch size the last score call asked for (None: never scored)."""
        ...


def _answered_batch_size(live: ServedRequests) -> ReadbackValue:
    from xconf.runtime.requests import batch_size_from_requests

    return batch_size_from_requests(live.request_sizes, live.requested_batch_size)


def _at_construction(request: KnobRequest) -> KnobApplication:
    return request.applied("set at engine construction")


# Two handlers every runtime that honours the knob shares: a setting the engine is built
# with as requested (each runtime gives it its own ``reading``), and ``batch.size`` (the
# frozen samples, chunked into requests, read back from the requests the engine answered).
AT_CONSTRUCTION = KnobHandler(_at_construction)
CHUNKED_REQUESTS = KnobHandler(
    lambda request: request.applied("frozen samples chunked into requests of this size"),
    _answered_batch_size,
)


def knob_readback(handlers: Handlers, side: Side, live: Any) -> dict[str, ReadbackValue]:
    """Each knob of ``side`` read from the engine's live state by its handler: the one way a
    knob's actual value is taken, on every runtime (a handler without a readback reads
    nothing, and the knob is unobservable)."""
    return {
        path: handler.readback(live)
        for path, handler in handlers.items()
        if handler.readback is not None and KNOBS[path].side in (side, "both")
    }


@dataclass(frozen=True)
class SideBinding:
    """What the adapter will configure for one side, and the fingerprints the facade derived."""

    side: Side
    knobs: tuple[KnobApplication, ...]
    dtype: str
    distributed_context: tuple[tuple[str, Any], ...]  # world size, rank, backend, ...
    construction_fingerprint: str = ""
    distributed_fingerprint: str = ""
    process_fingerprint: str = ""

    def reuse_key(self) -> tuple[str, str, str]:
        return (
            self.construction_fingerprint,
            self.distributed_fingerprint,
            self.process_fingerprint,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "side": self.side,
            "dtype": self.dtype,
            "knobs": [k.to_dict() for k in self.knobs],
            "distributed_context": dict(self.distributed_context),
            "fingerprints": {
                "construction": self.construction_fingerprint,
                "distributed_context": self.distributed_fingerprint,
                "process": self.process_fingerprint,
            },
        }


@dataclass(frozen=True)
class RuntimeBinding:
    runtime_kind: str
    case_id: str
    rollout: SideBinding
    training: SideBinding
    scorers: tuple[tuple[str, str], ...]  # side -> scorer name and version

    def side(self, side: Side) -> SideBinding:
        return self.rollout if side == "rollout" else self.training

    def to_dict(self) -> dict[str, Any]:
        return {
            "runtime_kind": self.runtime_kind,
            "case_id": self.case_id,
            "scorers": dict(self.scorers),
            "sides": {s.side: s.to_dict() for s in (self.rollout, self.training)},
        }


@dataclass(frozen=True)
class FrozenInputs:
    """The identity's token-level fields as tensors: [B, T] each."""

    token_ids: torch.Tensor
    selected_token_ids: torch.Tensor
    active_mask: torch.Tensor  # bool
    attention_mask: torch.Tensor  # bool
    position_ids: torch.Tensor


@dataclass(frozen=True)
class ReadOnlyEvidence:
    """How a scorer proves it changed nothing and generated nothing."""

    state_digest_before: str
    state_digest_after: str
    mode_restored: bool
    used_kv_cache: bool
    generated_tokens: bool


@dataclass(frozen=True)
class SideScore:
    """A side's selected logprobs [B, T] (float32) and an echo of the input it scored."""

    logprobs: torch.Tensor
    scored_token_ids: torch.Tensor
    scored_selected_ids: torch.Tensor
    scored_active_mask: torch.Tensor
    evidence: ReadOnlyEvidence
    identity_digest: str
    # The full-vocabulary logits rows of the active tokens, [active tokens, vocab] float32,
    # row-major over the active mask (None: the engine keeps none). Figures only
    # (``xconf/full_vocab.py``): never part of the verdict or of the stored scores.
    vocab_rows: torch.Tensor | None = None


@runtime_checkable
class Engine(Protocol):
    """A constructed scorer for one side; may be reused across cases with equal fingerprints.

    Every method is required, and an engine that wraps another (a timer, the placement on a
    side's ranks) forwards each one: the runner reaches nothing of an engine with ``getattr``.
    """

    def readback(self) -> Mapping[str, ReadbackValue]:
        """What the engine reports: its readings (``runtime/readback`` names) and each knob's
        actual value, read from its live state by the knob's handler (``knob_readback``)."""
        ...

    def score(
        self,
        inputs: FrozenInputs,
        identity: Identity,
        batch_size: int,
        operator: SelectedLogprobOp | None,
    ) -> SideScore:
        """Score the frozen tokens read-only; ``operator`` None means the runtime's native path."""
        ...

    def reset_state(self) -> None:
        """Forget what the engine kept from the calls before (a prefix or KV cache, the
        requests it answered): the engine cache calls it before every reuse, so no case sees
        another's state. An engine that keeps nothing across calls does nothing."""
        ...

    def embedded_tokens(self) -> Sequence[tuple[torch.Tensor, torch.Tensor]] | None:
        """(token ids, position ids) the model itself embedded in the last scoring call, by
        its own record (``runtime/guards.check_embedded`` checks them against the frozen
        rows); None: the engine keeps no such record, and the scorer's echo is all there is."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class RuntimeAdapter(Protocol):
    runtime_kind: str
    device: str
    version: str

    def freeze_identity(self, identity: Identity) -> Identity:
        """Return the identity with frozen tokens (a recipe identity is frozen here, once)."""
        ...

    def bind(self, case: ExecutionCase, identity: Identity) -> RuntimeBinding:
        """Requested -> materialized for every knob; pure, builds nothing."""
        ...

    def build_engine(self, binding: SideBinding, case: ExecutionCase) -> Engine: ...

    def environment(self) -> Mapping[str, str]:
        """Versions that an attempt's validity depends on (framework, engine, torch)."""
        ...

    def close(self) -> None: ...
