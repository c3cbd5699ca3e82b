"""The vLLM rollout side's engine: the Engine protocol over
:class:`~xconf.adapters.vllm.engine.VllmRolloutEngine`, and what its live state reports
beside the knobs (``rollout_readings``)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from xconf.adapters.frozen import FrozenBatch
from xconf.adapters.frozen_side import FrozenSide
from xconf.adapters.vllm.live_weights import worker_weight_digest
from xconf.experiment import Identity
from xconf.runtime.protocol import (
    ReadbackFailure,
    ReadbackValue,
    ReadOnlyEvidence,
    SelectedLogprobOp,
)
from xconf.runtime.readback import (
    ROLLOUT_REQUEST_SIZES,
    ROLLOUT_VOCAB_LAYOUT,
    ROLLOUT_WORKER_STATE,
    ROLLOUT_WORKERS,
)

if TYPE_CHECKING:
    from xconf.adapters.vllm.state import VllmState


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


def rollout_readings(live: VllmState) -> dict[str, Any]:
    """What a vLLM engine reports beside its knobs: its readings, and the vocabulary layout
    its TP workers built."""
    workers = live.workers
    layout = (
        ReadbackFailure(str(live.workers_error or "no worker state"))
        if workers is None
        else _vocab_layout(list(workers))
    )
    readings = live.readings()
    return {
        **readings,
        ROLLOUT_VOCAB_LAYOUT.name: layout,
        ROLLOUT_WORKER_STATE.name: repr(readings[ROLLOUT_WORKERS.name]),
        ROLLOUT_REQUEST_SIZES.name: repr(readings[ROLLOUT_REQUEST_SIZES.name]),
    }


class VllmRolloutSide(FrozenSide):
    """Engine protocol over :class:`~xconf.adapters.vllm.engine.VllmRolloutEngine`;
    ``readback`` is the side's (``side.VLLM.readback``: readings and each knob's handler).
    Its engine keeps every scored token's logits row (``rows.py``), native path included."""

    keeps_vocab_rows = True

    def __init__(
        self,
        cfg: Any,
        readback: Callable[[VllmState], Mapping[str, ReadbackValue]],
        engine_class: type[Any] | None = None,
        scoring_mode: str | None = None,
    ) -> None:
        from xconf.adapters.vllm.engine import VllmRolloutEngine

        self.engine = (engine_class or VllmRolloutEngine)(cfg)
        self._readback = readback
        # rollout.scoring_mode where the case declares it; None: the identity's
        self.scoring_mode = scoring_mode

    def _weights(self) -> str:
        digests = self.engine.llm.collective_rpc(worker_weight_digest)
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
        logprobs = score_frozen(
            self.engine, batch, mode, batch_size, operator, vocab_rows=self.vocab_rows
        )
        evidence = ReadOnlyEvidence(
            state_digest_before=before,
            state_digest_after=self._weights(),
            mode_restored=True,  # an inference engine has no train/eval mode
            used_kv_cache=True,  # the rollout side decodes with its paged KV cache
            generated_tokens=False,  # forced decoding emitted exactly the frozen tokens (checked)
        )
        return logprobs, evidence

    def readback(self) -> Mapping[str, ReadbackValue]:
        return self._readback(self.engine.live())

    def reset_state(self) -> None:
        self.engine.reset_state()

    def close(self) -> None:
        self.engine.close()
