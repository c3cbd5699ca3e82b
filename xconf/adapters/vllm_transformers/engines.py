"""Engine-protocol wrappers: a vLLM rollout engine and a transformers training scorer."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from xconf.adapters.errors import IdentityViolationError, ScoringError
from xconf.adapters.frozen import FrozenBatch
from xconf.adapters.vllm_transformers.handlers import HANDLERS
from xconf.experiment import Identity
from xconf.operators.catalog import Side
from xconf.runtime.protocol import (
    FrozenInputs,
    Handlers,
    ReadbackFailure,
    ReadbackValue,
    ReadOnlyEvidence,
    SelectedLogprobOp,
    SideScore,
    knob_readback,
)
from xconf.runtime.ranks import SideGroup, from_rank0
from xconf.runtime.readback import (
    ROLLOUT_REQUEST_SIZES,
    ROLLOUT_VOCAB_LAYOUT,
    ROLLOUT_WORKER_STATE,
    ROLLOUT_WORKERS,
)

if TYPE_CHECKING:
    from xconf.adapters.hf.scorer import ScorerState
    from xconf.adapters.vllm.state import VllmState


def _readback_values(live: Mapping[str, Any]) -> dict[str, ReadbackValue]:
    """The readback values an engine reports: scalars, None, layouts and failed reads."""
    from xconf.ops.logprob.contract import ShardingSpec

    kept = (bool, int, str, ShardingSpec, ReadbackFailure)
    return {k: v for k, v in live.items() if v is None or isinstance(v, kept)}


def _vocab_layout(workers: list[dict[str, Any]]) -> ReadbackValue:
    """One layout from the TP workers' vocab shards (None: the model exposes no lm_head)."""
    from xconf.ops.logprob.contract import ShardingSpec
    from xconf.ops.logprob.errors import LogprobContractError

    shards = [w.get("vocab") for w in workers]
    if not shards or any(s is None for s in shards):
        return None
    ordered = sorted((s for s in shards if s is not None), key=lambda s: s["tp_rank"])
    sizes = {(s["real_vocab_size"], s["padded_vocab_size"]) for s in ordered}
    if len(sizes) != 1:
        return ReadbackFailure(f"the TP workers report different vocab sizes {sorted(sizes)}")
    real, padded = sizes.pop()
    try:
        return ShardingSpec(real, padded, tuple((s["start"], s["end"]) for s in ordered))
    except LogprobContractError as exc:
        return ReadbackFailure(f"the workers' vocab shards are not one layout: {exc.message}")


def rollout_readback(live: VllmState) -> dict[str, ReadbackValue]:
    """What a vLLM engine reports: its readings, each rollout knob read from its live state
    by the knob's handler, and the vocabulary layout its TP workers built."""
    workers = live.workers
    layout = (
        ReadbackFailure(str(live.workers_error or "no worker state"))
        if workers is None
        else _vocab_layout(list(workers))
    )
    readings = live.readings()
    return _readback_values(
        {
            **readings,
            **knob_readback(HANDLERS, "rollout", live),
            ROLLOUT_VOCAB_LAYOUT.name: layout,
            ROLLOUT_WORKER_STATE.name: repr(readings[ROLLOUT_WORKERS.name]),
            ROLLOUT_REQUEST_SIZES.name: repr(readings[ROLLOUT_REQUEST_SIZES.name]),
        }
    )


def _check_inputs(inputs: FrozenInputs, batch: FrozenBatch) -> None:
    """The tensors the runner hands over must be the identity's own frozen layout."""
    import torch

    layout = batch.layout()
    for name in (
        "token_ids",
        "selected_token_ids",
        "active_mask",
        "attention_mask",
        "position_ids",
    ):
        given = getattr(inputs, name)
        expected = torch.tensor(layout[name], dtype=given.dtype)
        if given.shape != expected.shape or not torch.equal(given, expected):
            raise IdentityViolationError(
                "identity.inputs_mismatch",
                f"frozen inputs disagree with the identity on {name}",
                f"identity.{name}",
            )


def _worker_weight_digest(worker: Any) -> str:
    """Runs in each vLLM worker: digest of the loaded (rank-local) weights."""
    import torch

    h = hashlib.sha256()
    for name, p in sorted(worker.model_runner.model.named_parameters(), key=lambda kv: kv[0]):
        h.update(name.encode())
        h.update(p.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


class _FrozenSide:
    """Scores the identity's own frozen layout (the runner's tensors are checked against it
    first) and echoes back what it scored; a side supplies ``_score`` and its evidence."""

    def score(
        self,
        inputs: FrozenInputs,
        identity: Identity,
        batch_size: int,
        operator: SelectedLogprobOp | None,
    ) -> SideScore:
        batch = FrozenBatch.from_identity(identity)
        _check_inputs(inputs, batch)
        logprobs, evidence = self._score(batch, identity, batch_size, operator)
        return SideScore(
            logprobs=logprobs,
            scored_token_ids=inputs.token_ids.clone(),
            scored_selected_ids=inputs.selected_token_ids.clone(),
            scored_active_mask=inputs.active_mask.clone(),
            evidence=evidence,
            identity_digest=identity.digest(),
        )

    def _score(
        self,
        batch: FrozenBatch,
        identity: Identity,
        batch_size: int,
        operator: SelectedLogprobOp | None,
    ) -> tuple[Any, ReadOnlyEvidence]:
        raise NotImplementedError


class VllmRolloutSide(_FrozenSide):
    """Engine protocol over :class:`~xconf.adapters.vllm.engine.VllmRolloutEngine`."""

    def __init__(
        self, cfg: Any, engine_class: type[Any] | None = None, scoring_mode: str | None = None
    ) -> None:
        from xconf.adapters.vllm.engine import VllmRolloutEngine

        self.engine = (engine_class or VllmRolloutEngine)(cfg)
        # rollout.scoring_mode where the case declares it; None: the identity's
        self.scoring_mode = scoring_mode

    def _weights(self) -> str:
        digests = self.engine.llm.collective_rpc(_worker_weight_digest)
        return hashlib.sha256("|".join(digests).encode()).hexdigest()

    def _score(
        self,
        batch: FrozenBatch,
        identity: Identity,
        batch_size: int,
        operator: SelectedLogprobOp | None,
    ) -> tuple[Any, ReadOnlyEvidence]:
        from xconf.adapters.vllm.scorer import score_frozen

        before = self._weights()
        mode = self.scoring_mode or identity.scoring_mode
        logprobs = score_frozen(self.engine, batch, mode, batch_size, operator)
        evidence = ReadOnlyEvidence(
            state_digest_before=before,
            state_digest_after=self._weights(),
            mode_restored=True,  # an inference engine has no train/eval mode
            used_kv_cache=True,  # the rollout side decodes with its paged KV cache
            generated_tokens=False,  # forced decoding emitted exactly the frozen tokens (checked)
        )
        return logprobs, evidence

    def readback(self) -> Mapping[str, ReadbackValue]:
        return rollout_readback(self.engine.live())

    def close(self) -> None:
        self.engine.close()


class OnSideRanks:
    """An engine that lives only on its side's ranks (``0 .. size - 1`` of the launched world).

    ``build(group)`` constructs the real engine on member ranks (``group`` is the side's
    sub-group, None for the whole world). The ranks outside the side build nothing and
    receive rank 0's score and readback, so every rank reaches the same verdict without
    joining the side's collectives.
    """

    def __init__(self, build: Callable[[Any], Any], side: SideGroup) -> None:
        self.side = side
        self.engine: Any = build(side.group) if side.member else None

    @classmethod
    def on(cls, ranks: int, build: Callable[[Any], Any]) -> OnSideRanks:
        """The engine ``build(group)`` makes, on launched ranks ``0 .. ranks - 1``."""
        from xconf.runtime.ranks import side_group

        return cls(build, side_group(ranks))

    def score(
        self,
        inputs: FrozenInputs,
        identity: Identity,
        batch_size: int,
        operator: SelectedLogprobOp | None,
    ) -> SideScore:
        score = self.engine.score(inputs, identity, batch_size, operator) if self.engine else None
        if self.side.is_sub_group:
            score = from_rank0(score)
        if score is None:  # pragma: no cover - rank 0 is a member of every side group
            raise ScoringError("runtime.no_score", "no member rank scored", "launcher")
        return score  # type: ignore[no-any-return]

    def readback(self) -> Mapping[str, ReadbackValue]:
        live = self.engine.readback() if self.engine else None
        if self.side.is_sub_group:
            live = from_rank0(live)
        return live or {}

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()


class HfTrainingSide(_FrozenSide):
    """Engine protocol over :class:`~xconf.adapters.hf.scorer.HFTrainingScorer`: each knob of
    ``side`` read back from the scorer's live state by its handler in ``handlers``."""

    handlers: ClassVar[Handlers] = HANDLERS
    side: ClassVar[Side] = "training"

    def __init__(self, cfg: Any, group: Any = None) -> None:
        from xconf.adapters.hf.scorer import HFTrainingScorer

        self.scorer = HFTrainingScorer(cfg, group)

    def _score(
        self,
        batch: FrozenBatch,
        identity: Identity,
        batch_size: int,
        operator: SelectedLogprobOp | None,
    ) -> tuple[Any, ReadOnlyEvidence]:
        result = self.scorer.score(batch, batch_size, operator)
        evidence = ReadOnlyEvidence(
            state_digest_before=f"{result.digest_before.parameters}:{result.digest_before.buffers}",
            state_digest_after=f"{result.digest_after.parameters}:{result.digest_after.buffers}",
            mode_restored=result.mode_restored,
            # a full pass runs use_cache=False; the decode mode attends over KV caches
            used_kv_cache=self.scorer.uses_kv_cache,
            generated_tokens=False,
        )
        return result.logprobs, evidence

    def readings(self, live: ScorerState) -> dict[str, Any]:
        """What the scorer reports beside its knobs."""
        return live.readings()

    def readback(self) -> Mapping[str, ReadbackValue]:
        live = self.scorer.live()
        return _readback_values(
            {**self.readings(live), **knob_readback(self.handlers, self.side, live)}
        )

    def close(self) -> None:
        self.scorer.model = None
