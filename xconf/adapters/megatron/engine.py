"""The Megatron training side as an engine: score, readback, reset_state, close.

One :class:`MegatronTrainingSide` per tensor-parallel rank of the side: it builds the
``GPTModel`` shard of its rank (``model.build_model``: weights mapped and proven), scores the
frozen tokens read-only (``scorer.score_frozen``) and exposes its live state
(``state.MegatronState``), from which each knob's handler reads the knob back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from xconf.adapters.frozen_side import FrozenSide
from xconf.adapters.megatron.model import MegatronConfig
from xconf.experiment import Identity
from xconf.runtime.protocol import ReadbackValue, ReadOnlyEvidence, SelectedLogprobOp

if TYPE_CHECKING:
    from xconf.adapters.frozen import FrozenBatch
    from xconf.adapters.megatron.scorer import MegatronScore
    from xconf.adapters.megatron.state import MegatronState


def _vocab_bounds(model: Any, group: Any) -> tuple[tuple[int, int], ...]:
    """Every TP rank's vocabulary rows, as the live embedding holds them (rank order)."""
    import torch.distributed as dist

    emb = model.embedding.word_embeddings
    mine = (int(emb.vocab_start_index), int(emb.vocab_end_index))
    if group.size() == 1:
        return (mine,)
    every: list[Any] = [None] * group.size()
    dist.all_gather_object(every, mine, group=group)
    return tuple((int(lo), int(hi)) for lo, hi in every)


class MegatronTrainingSide(FrozenSide):
    """Engine protocol over one rank of a Megatron ``GPTModel``; ``group`` is the side's
    tensor-parallel group in the launched world (None: the whole world, or TP 1);
    ``readback`` is the side's (``side.TRAINING.readback``: its readings and each knob read
    by its handler)."""

    def __init__(
        self,
        cfg: MegatronConfig,
        readback: Callable[[MegatronState], Mapping[str, ReadbackValue]],
        group: Any = None,
    ) -> None:
        import torch.distributed as dist

        from xconf.adapters.megatron.arch import megatron_arch
        from xconf.adapters.megatron.logprob import VocabShards
        from xconf.adapters.megatron.model import build_model
        from xconf.adapters.megatron.shims import one_rank_group

        self.cfg = cfg
        self._readback = readback
        self.arch = megatron_arch(cfg.model_path, cfg.trust_remote_code)
        if cfg.tensor_parallel_size == 1:
            tp_group = one_rank_group()  # no communication: whoever owns the default world
        else:
            tp_group = group if group is not None else dist.group.WORLD
        self.model, self.weights = build_model(cfg, self.arch, tp_group)
        self.shards = VocabShards(
            tp_group, self.arch.vocab_size, _vocab_bounds(self.model, tp_group)
        )
        self.last: MegatronScore | None = None
        self.last_batch_size: int | None = None

    def _score(
        self,
        batch: FrozenBatch,
        identity: Identity,
        batch_size: int,
        operator: SelectedLogprobOp | None,
    ) -> tuple[Any, ReadOnlyEvidence]:
        from xconf.adapters.megatron.scorer import score_frozen

        self.last_batch_size = batch_size
        self.last = score_frozen(
            self.model,
            batch,
            batch_size,
            self.shards,
            device=self.cfg.device,
            op=operator,
            remove_padding=self.cfg.remove_padding,
            sequence_multiple=self.cfg.tensor_parallel_size if self.cfg.sequence_parallel else 1,
            fused_cross_entropy=self.cfg.cross_entropy_loss_fusion,
        )
        evidence = ReadOnlyEvidence(
            state_digest_before=self.last.digest_before,
            state_digest_after=self.last.digest_after,
            mode_restored=self.last.mode_restored,
            used_kv_cache=False,  # no inference context: one full teacher-forced pass
            generated_tokens=False,
        )
        return self.last.logprobs, evidence

    def live(self) -> MegatronState:
        """The side's live state: its model as it is now and the last call's forwards."""
        import torch.distributed as dist

        from xconf.adapters.hf.readonly import state_digest
        from xconf.adapters.megatron.state import MegatronState, read_model

        last = self.last
        return MegatronState(
            model=read_model(self.model),
            model_class=type(self.model).__name__,
            vocab_layout=self.shards.spec(),
            weights_verified=self.weights.parameters - len(self.weights.mismatched),
            launcher_world_size=dist.get_world_size() if dist.is_initialized() else 1,
            state_digest=state_digest(self.model).to_dict(),
            request_sizes=() if last is None else last.request_sizes,
            requested_batch_size=self.last_batch_size,
            layouts=() if last is None else last.layouts,
            cross_entropy=None if last is None else last.cross_entropy,
        )

    def readback(self) -> Mapping[str, ReadbackValue]:
        return self._readback(self.live())

    def reset_state(self) -> None:
        """Forget the last call (its forwards and requests): a reused engine's readback is
        then of the next case's call alone. The model itself keeps no state between calls
        (no KV cache, no inference context)."""
        self.last = None
        self.last_batch_size = None

    def close(self) -> None:
        self.model = None
