"""The transformers scorer's lm_head dtype (``training.logits_dtype``, and ``rollout.logits_dtype``
of hf_pair's reference scorer), and the temperature the trainer divides its logits by
(``training.temperature``).

``float32`` binds a forward to the loaded model's output embedding that casts the hidden
states and the head's weight to float32 before the projection, as vLLM's LogitsProcessor does
under ``head_dtype=float32`` on CPU (``F.linear`` of the float32 casts); the weight itself is
never changed (the cast is a copy per call). What the head really returned is recorded by a
forward hook on the same module, so the knob is read back from the forwards that ran, not
from the setting.
"""

from __future__ import annotations

import types
from typing import Any

from xconf.adapters.errors import UnsupportedKnobError
from xconf.knobs import LOGITS_FLOAT32, LOGITS_MODEL, TRAINING_LOGITS_DTYPE, TRAINING_TEMPERATURE

# Marks a head whose forward this module bound (``arm_counts`` and localize see a plain head).
FLOAT32_HEAD = "_xconf_float32_head"


def _float32_forward(self: Any, hidden: Any) -> Any:
    import torch.nn.functional as F

    bias = None if self.bias is None else self.bias.float()
    return F.linear(hidden.float(), self.weight.float(), bias)


def install_float32_head(model: Any) -> None:
    """The model's lm_head projects in float32 (hidden states and weight cast first)."""
    head = model.get_output_embeddings()
    if head is None or not hasattr(head, "weight"):
        raise UnsupportedKnobError(
            "unsupported_value",
            f"{type(model).__name__} has no lm_head to project in float32",
            TRAINING_LOGITS_DTYPE.path,
        )
    head.__dict__[FLOAT32_HEAD] = True
    head.forward = types.MethodType(_float32_forward, head)


class HeadDtypes:
    """The dtypes of the logits the model's lm_head returned since the last ``clear``."""

    def __init__(self, model: Any) -> None:
        self.seen: set[str] = set()
        head = model.get_output_embeddings()
        self._compute: str | None = None
        if head is not None:  # a model without an output embedding has no head to read
            self._compute = str(head.weight.dtype).removeprefix("torch.")
            head.register_forward_hook(self._record)

    def _record(self, module: Any, inputs: Any, output: Any) -> None:
        self.seen.add(str(output.dtype).removeprefix("torch."))

    def clear(self) -> None:
        self.seen = set()

    def reading(self) -> str | None:
        """``model`` where every head output had the compute dtype, ``float32`` where it was
        cast up; None: no forward ran, or outputs of several dtypes."""
        if len(self.seen) != 1:
            return None
        (dtype,) = self.seen
        if dtype == self._compute:
            return LOGITS_MODEL
        return LOGITS_FLOAT32 if dtype == LOGITS_FLOAT32 else None


class Temperature:
    """The logits divided by ``temperature`` after the head, whatever computes the head (the
    model's own, a float32 one, the logits arm's), as verl's actor divides them
    (``logits.div_(temperature)``) before its log-softmax; the divisor of every call is
    recorded, so the knob reads back from the forwards that ran. 1.0 binds nothing."""

    def __init__(self, model: Any, temperature: float) -> None:
        self.temperature = temperature
        self.seen: set[float] = set()
        head = model.get_output_embeddings()
        if temperature == 1.0:
            return
        if head is None:
            raise UnsupportedKnobError(
                "unsupported_value",
                f"{type(model).__name__} has no lm_head whose logits to divide",
                TRAINING_TEMPERATURE.path,
            )
        computed = head.forward

        def divided(hidden: Any) -> Any:
            self.seen.add(temperature)
            return computed(hidden) / temperature

        head.forward = divided

    def clear(self) -> None:
        self.seen = set()

    def reading(self) -> float | None:
        """The divisor of the scored forwards' logits (1.0: nothing divides them; None: no
        forward divided them yet)."""
        if self.temperature == 1.0:
            return 1.0
        return next(iter(self.seen)) if len(self.seen) == 1 else None
