"""What one forward of an aligned or decode-shaped scoring call computes, for the forwards
that the arms and the decode mode install.

A forward's hidden states are ``[B, T, H]``; request ``r`` of the forward occupies row
``rows[r]``, columns ``cols[r] .. cols[r] + counts[r]`` (a padded batch: one request per row;
a packed row or a decode step: all requests in row 0). Its attention reads and extends that
request's KV cache (the decode mode), or attends over its own tokens only (a full forward).
The scorer enters a :class:`Step` around each forward (``entered``); an installed forward
called outside one is refused, never run on a guess.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from xconf.adapters.errors import ScoringError
from xconf.knobs import ALIGN_PREFIX, TRAINING_ALIGN_RMS_NORM


class StepAttention(Protocol):
    """How a step's attention core runs: transformers' own function on the whole batch,
    per request over transformers-layout caches, or vLLM's paged kernel."""

    def attend(
        self, module: Any, layer: int, q: Any, k: Any, v: Any, mask: Any, step: Step, **kwargs: Any
    ) -> Any:
        """q [B, heads, T, hd], k and v [B, kv heads, T, hd] -> [B, T, heads * hd]."""


@dataclass
class Carry:
    """A decoder layer's MLP output and residual, and the sum it returned (vLLM adds them in
    the next fused norm; the next layer takes them back only if it receives that very sum)."""

    out: Any
    residual: Any
    total: Any


@dataclass
class Step:
    positions: Any  # [B, T] position of every token (0 on padding)
    rows: tuple[int, ...]
    cols: tuple[int, ...]
    counts: tuple[int, ...]
    attention: StepAttention
    requests: tuple[int, ...]  # which sample of the scoring call each request is
    carry: Carry | None = field(default=None)

    def take_carry(self, hidden_states: Any) -> Carry | None:
        """The previous layer's pending (output, residual) when ``hidden_states`` is the sum it
        returned; None for the first layer."""
        carry, self.carry = self.carry, None
        if carry is None:
            return None
        if carry.total is not hidden_states:
            raise ScoringError(
                "arm.residual_changed",
                "a decoder layer received another tensor than the previous layer returned; "
                "the fused residual add cannot be placed",
                TRAINING_ALIGN_RMS_NORM.path,
            )
        return carry

    def token_index(self, width: int) -> Any:
        """Flat indices (into B * T) of the requests' tokens, request by request."""
        import torch

        return torch.cat(
            [
                torch.arange(row * width + col, row * width + col + n)
                for row, col, n in zip(self.rows, self.cols, self.counts, strict=True)
            ]
        )


_CURRENT: contextvars.ContextVar[Step | None] = contextvars.ContextVar("xconf_step", default=None)


@contextlib.contextmanager
def entered(step: Step) -> Iterator[Step]:
    token = _CURRENT.set(step)
    try:
        yield step
    finally:
        _CURRENT.reset(token)


def current(where: str) -> Step:
    step = _CURRENT.get()
    if step is None:
        raise ScoringError(
            "arm.outside_scorer",
            f"{where} runs with replaced forwards that only xconf's scorer can drive",
            ALIGN_PREFIX,
        )
    return step


class WholeBatch:
    """transformers' own attention function over the whole forward, with the mask the model
    built: what the model computes without an attention arm in a full forward."""

    def __init__(self, function: Any) -> None:
        self.function = function

    def attend(
        self, module: Any, layer: int, q: Any, k: Any, v: Any, mask: Any, step: Step, **kwargs: Any
    ) -> Any:
        out, _ = self.function(module, q, k, v, mask, dropout=0.0, scaling=module.scaling, **kwargs)
        return out.reshape(*out.shape[:2], -1)


class RequestCaches:
    """transformers' own attention function, one request at a time, each over its own keys and
    values so far (the decode mode without the attention arm), masked as the model masks one
    unpadded sequence: sdpa's own causal rule where it applies, an explicit mask otherwise."""

    def __init__(self, function: Any, implementation: str) -> None:
        self.function = function
        self.own_causal = implementation == "sdpa"
        self.kv: dict[tuple[int, int], tuple[Any, Any]] = {}

    def attend(
        self, module: Any, layer: int, q: Any, k: Any, v: Any, mask: Any, step: Step, **kwargs: Any
    ) -> Any:
        import torch

        batch, heads, width, head_dim = q.shape
        out = q.new_zeros((batch, width, heads * head_dim))
        for r, (row, col, n) in enumerate(zip(step.rows, step.cols, step.counts, strict=True)):
            qr = q[row : row + 1, :, col : col + n]
            kr, vr = k[row : row + 1, :, col : col + n], v[row : row + 1, :, col : col + n]
            key = (layer, step.requests[r])
            before = self.kv.get(key)
            if before is not None:
                kr, vr = torch.cat([before[0], kr], dim=2), torch.cat([before[1], vr], dim=2)
            self.kv[key] = (kr, vr)
            mask = _causal(n, kr.shape[2], q, self.own_causal)
            o, _ = self.function(module, qr, kr, vr, mask, dropout=0.0, scaling=module.scaling)
            out[row, col : col + n] = o.reshape(n, heads * head_dim)
        return out


def _causal(n: int, total: int, like: Any, own_causal: bool) -> Any:
    """None where no mask is needed (one query) or sdpa's own causal rule is right (no earlier
    keys); else an additive mask letting query i see keys ``0 .. total - n + i``."""
    import torch

    if n == 1 or (n == total and own_causal):
        return None
    allowed = torch.ones((n, total), dtype=torch.bool).tril(diagonal=total - n)
    mask = torch.zeros((n, total), dtype=like.dtype)
    mask.masked_fill_(~allowed, torch.finfo(like.dtype).min)
    return mask[None, None]


class VllmPaged:
    """vLLM's CPU attention over its paged KV cache (the attention arm), in full or decode
    forwards alike: the step's request tokens are gathered, attended, scattered back (the
    scorer calls ``paged.begin_step`` before each forward)."""

    def __init__(self, paged: Any) -> None:
        self.paged = paged

    def attend(
        self, module: Any, layer: int, q: Any, k: Any, v: Any, mask: Any, step: Step, **kwargs: Any
    ) -> Any:
        batch, heads, width, head_dim = q.shape
        index = step.token_index(width)

        def tokens(x: Any) -> Any:
            return x.transpose(1, 2).reshape(batch * width, x.shape[1], head_dim)[index]

        out = self.paged(layer, tokens(q).contiguous(), tokens(k), tokens(v), module.scaling)
        full = q.new_zeros((batch * width, heads, head_dim))
        full[index] = out
        return full.reshape(batch, width, heads * head_dim)
