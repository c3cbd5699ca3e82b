"""The frozen tokens every Megatron test scores (and the contract's float32 threshold)."""

from __future__ import annotations

import functools
from typing import Any

import torch

from xconf.adapters.frozen import FrozenBatch, FrozenSample


def frozen_batch(seed: int = 0, vocab: int = 384) -> FrozenBatch:
    """Four samples of different lengths (padding in every request of two)."""
    g = torch.Generator().manual_seed(seed)

    def ids(n: int) -> tuple[int, ...]:
        return tuple(int(t) for t in torch.randint(3, vocab, (n,), generator=g))

    return FrozenBatch(
        tuple(FrozenSample(ids(4 + 3 * i), ids(9 - 2 * i)) for i in range(4)), pad_token_id=0
    )


BATCH = frozen_batch()
ACTIVE = torch.tensor(BATCH.layout()["active_mask"], dtype=torch.bool)


@functools.cache
def identity() -> Any:
    """BATCH as a frozen identity (what the runner hands every engine)."""
    from xconf.adapters.frozen import build_identity

    return build_identity(
        BATCH,
        checkpoint_id="tiny",
        model_version="tiny",
        tokenizer_id="tiny",
        pre_update_state="random",
        scoring_mode="prefill",
        recipe={},
    )


def engine(root: Any, **settings: Any) -> Any:
    """One rank's Megatron engine on the checkpoint at ``root`` (TP 1 unless asked), with
    the side's own readback."""
    from xconf.adapters.megatron.engine import MegatronTrainingSide
    from xconf.adapters.megatron.model import MegatronConfig
    from xconf.adapters.megatron.side import TRAINING

    return MegatronTrainingSide(MegatronConfig(model_path=str(root), **settings), TRAINING.readback)


def score(engine: Any, op: Any = None, size: int = 2) -> torch.Tensor:
    """The engine's scores of the identity, through the Engine protocol."""
    from xconf.side_scoring import frozen_inputs

    result = engine.score(frozen_inputs(identity()), identity(), size, op)
    evidence = result.evidence
    assert evidence.state_digest_before == evidence.state_digest_after
    assert evidence.mode_restored and not evidence.used_kv_cache
    return result.logprobs


def threshold() -> float:
    from xconf.contract.loader import load_contract

    return float(load_contract().threshold_for("float32", "float32").value)


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs()[ACTIVE].max())
