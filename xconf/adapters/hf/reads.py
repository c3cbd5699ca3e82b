"""How the transformers sides read each knob back: from the live state the scorer exposes
(``scorer.ScorerState``: its model as it is now and the forwards it ran). Each function here
is one handler's ``readback`` (``handlers.py``), on the training side and on the reference
scorer's rollout side alike.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from xconf.adapters.hf.scorer import ScorerState


def attention(live: ScorerState) -> str:
    return live.model.attention


def compute_dtype(live: ScorerState) -> str | None:
    """The parameters' one dtype (None: mixed dtypes, not one observable value)."""
    dtypes = live.model.param_dtypes
    return dtypes[0] if len(dtypes) == 1 else None


def sharding(live: ScorerState) -> str:
    return live.model.sharding


def param_dtype(live: ScorerState) -> str:
    return live.model.policy[0]


def reduce_dtype(live: ScorerState) -> str:
    return live.model.policy[1]


def remove_padding(live: ScorerState) -> bool | None:
    """What the forwards really were: one packed row per request, or a padded batch (None:
    both, or none ran)."""
    kinds = set(live.layouts)
    return (kinds.pop() == "packed") if len(kinds) == 1 else None


def unsharded_ranks(live: ScorerState) -> int | None:
    """One rank when the scorer is one unsharded module (the reference's TP)."""
    return 1 if live.model.sharding == "unsharded" else None


def logits_dtype(live: ScorerState) -> str | None:
    """What the lm_head returned in the last call: ``model`` or ``float32`` (None: nothing
    scored yet, or both)."""
    return live.logits_dtype


def temperature(live: ScorerState) -> float | None:
    """What the last call's logits were divided by before the log-softmax (1.0: nothing;
    None: nothing scored yet)."""
    return live.temperature
