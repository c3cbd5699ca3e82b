"""Which arms the fix search tries, in which order: pure, torch-free.

A first divergent module (localize's tap kind) names the arm kind that computes it
(``ARM_FOR_TAP``); the search tries that kind's arm, then cumulatively the kinds after it in
the order a decoder layer first computes them (``knobs.ALIGN_KINDS``), then the full arm
(``training.align.all``), then, when the identity allows the training side a KV cache, the
full arm in the rollout engine's step shapes (``training.scoring_mode=decode``). A step whose
knobs the case already holds, or one the full arm repeats, is left out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from xconf.knobs import (
    ALIGN_KINDS,
    ALIGN_VLLM,
    TRAINING_ALIGN,
    TRAINING_ALIGN_ALL,
    TRAINING_SCORING_MODE,
    KnobValue,
)

DECODE = "decode"

# localize's tap kinds (``localize/names.py``) -> the arm kind whose modules compute that tap.
# An attention output is the attention block (its GEMMs, rotary and attention kernels: the
# attention arm is the kernel vLLM swaps there); an MLP output the activation's block; the
# residual stream, the embeddings and the final norm meet the model's norms first; logits are
# the logits arm's.
ARM_FOR_TAP: dict[str, str] = {
    "embedding": "rms_norm",
    "attention": "attention",
    "mlp": "activation",
    "residual": "rms_norm",
    "final_norm": "rms_norm",
    "logits": "logits",
}
# No tap above its floor, yet the case fails: the drift is born after the last hidden state,
# where the logprobs are computed.
ARM_WITHOUT_TAP = "logits"


@dataclass(frozen=True)
class Step:
    """One case the search runs: the knobs it sets on top of the failing case's."""

    knobs: tuple[tuple[str, KnobValue], ...]
    full_arm: bool
    decode: bool

    @property
    def label(self) -> str:
        return ", ".join(f"{path}={value}" for path, value in self.knobs)


def start_kind(tap_kind: str | None) -> str:
    """The arm kind the search starts from, for localize's first divergent tap kind (None:
    no tap diverged, or localize could not run; then from the first kind)."""
    if tap_kind is None:
        return ALIGN_KINDS[0]
    return ARM_FOR_TAP.get(tap_kind, ALIGN_KINDS[0])


def steps(
    start: str, case_knobs: dict[str, KnobValue], *, kv_cache_allowed: bool
) -> tuple[Step, ...]:
    """The search's cases, in order, for a failing case holding ``case_knobs``."""
    first = ALIGN_KINDS.index(start)
    out: list[Step] = []
    for end in range(first + 1, len(ALIGN_KINDS) + 1):
        kinds = ALIGN_KINDS[first:end]
        if len(kinds) == len(ALIGN_KINDS):
            break  # every kind: that is the full arm
        out.append(_step({TRAINING_ALIGN[k].path: ALIGN_VLLM for k in kinds}, False, False))
    out.append(_step({TRAINING_ALIGN_ALL.path: ALIGN_VLLM}, True, False))
    if kv_cache_allowed:
        full_decode = {TRAINING_ALIGN_ALL.path: ALIGN_VLLM, TRAINING_SCORING_MODE.path: DECODE}
        out.append(_step(full_decode, True, True))
    kept: list[Step] = []
    seen: set[tuple[tuple[str, KnobValue], ...]] = set()
    for step in out:
        effective = tuple(sorted({**case_knobs, **dict(step.knobs)}.items()))
        if effective == tuple(sorted(case_knobs.items())) or effective in seen:
            continue  # the case already holds these knobs, or an earlier step ran them
        seen.add(effective)
        kept.append(step)
    return tuple(kept)


def _step(knobs: Mapping[str, KnobValue], full_arm: bool, decode: bool) -> Step:
    return Step(tuple(knobs.items()), full_arm, decode)  # forward order: the label reads so
