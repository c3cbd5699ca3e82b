"""The synthetic engines' live state: what the cpu-smoke handlers read each knob from."""

from __future__ import annotations

from dataclasses import dataclass

from xconf.ops.logprob.contract import ShardingSpec


@dataclass(frozen=True)
class TrainingState:
    """The training engine's live state, which the handlers read each knob from."""

    dtype: str  # the embedding's dtype: every parameter is cast together
    attention: str  # the attention the forwards compute
    sharding: str  # one unsharded module: the engine has no process group
    request_sizes: tuple[int, ...]
    requested_batch_size: int | None
    vocab_layout: ShardingSpec  # the output head as built (a reading, no knob)


@dataclass(frozen=True)
class RolloutState:
    """The rollout engine's live state, which the handlers read each knob from."""

    dtype: str
    prefix_caching: bool
    eager: bool
    ranks: int  # in-process ranks the model is computed on (one: no TP, no CP)
    request_sizes: tuple[int, ...]
    requested_batch_size: int | None
    vocab_layout: ShardingSpec
