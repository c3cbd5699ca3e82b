"""Guards around one side's scoring call: its own copy of the frozen inputs, checked after.

Each side scores a private copy of the frozen tensors, so a runtime that writes into its input
cannot change what the runner compares against or what the other side sees. After the call
the copy must still equal the identity, and the identity digest recomputed from what the side
echoes must equal the digest recorded in identity.json; otherwise the side did not score the
frozen input and the case is ``invalid_identity``, with the evidence.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import torch

from xconf.errors import IdentityViolation
from xconf.experiment import Identity
from xconf.runtime.protocol import Engine, FrozenInputs, SideScore

FIELDS = ("token_ids", "selected_token_ids", "active_mask", "attention_mask", "position_ids")


def side_copy(inputs: FrozenInputs) -> FrozenInputs:
    """A private copy of every frozen tensor for one side's scoring call."""
    return FrozenInputs(**{name: getattr(inputs, name).clone() for name in FIELDS})


def check_untouched(side: str, given: FrozenInputs, frozen: FrozenInputs) -> None:
    """The copy a side scored must still equal the frozen input: in-place writes are breaches."""
    for name in FIELDS:
        seen, truth = getattr(given, name), getattr(frozen, name)
        if seen.shape != truth.shape or seen.dtype != truth.dtype or not torch.equal(seen, truth):
            changed = int((seen != truth).sum()) if seen.shape == truth.shape else seen.numel()
            raise IdentityViolation(
                "identity.inputs_mutated",
                f"{side} wrote into its read-only copy of the frozen {name} "
                f"({changed} element(s) changed while scoring)",
                f"{side}:{name}",
            )


def _rows(tensor: torch.Tensor) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(int(x) for x in row) for row in tensor.tolist())


def echoed_digest(identity: Identity, score: SideScore) -> str:
    """The identity digest recomputed with the token fields this side says it scored."""
    try:
        echoed = replace(
            identity,
            token_ids=_rows(score.scored_token_ids),
            selected_token_ids=_rows(score.scored_selected_ids),
            active_mask=_rows(score.scored_active_mask.to(torch.int64)),
        )
    except (TypeError, ValueError, RuntimeError) as exc:
        return f"unreadable echo: {exc}"
    return echoed.digest()


def check_echo(side: str, identity: Identity, recorded_digest: str, score: SideScore) -> None:
    """identity.json's digest must be what this side's echo of its input digests to."""
    digest = echoed_digest(identity, score)
    if digest != recorded_digest:
        raise IdentityViolation(
            "identity.echo_mismatch",
            f"{side} echoes an input whose identity digest is {digest[:16]}, identity.json "
            f"records {recorded_digest[:16]}",
            f"{side}:identity",
        )


def input_digests(inputs: FrozenInputs) -> dict[str, str]:
    """SHA-256 of each frozen tensor (dtype, shape, bytes): the active mask among them."""
    import hashlib

    digests = {}
    for name in FIELDS:
        tensor = getattr(inputs, name).contiguous()
        h = hashlib.sha256(f"{tensor.dtype}:{tuple(tensor.shape)}".encode())
        h.update(tensor.numpy().tobytes())
        digests[f"{name}_sha256"] = h.hexdigest()
    return digests


@contextmanager
def no_optimizer(side: str) -> Iterator[None]:
    """A scorer owns no optimizer: any ``torch.optim.Optimizer`` constructed while the side's
    engine is built or scores (over the model's parameters or any others) is a breach.

    An optimizer made before the run started (outside xconf's view) is not seen here: the
    parameter digests still catch any step it takes while scoring.
    """
    optimizer = torch.optim.Optimizer
    original = optimizer.__init__
    created: list[str] = []

    def watched(self: Any, *args: Any, **kwargs: Any) -> None:
        created.append(type(self).__name__)
        original(self, *args, **kwargs)

    optimizer.__init__ = watched  # type: ignore[method-assign]
    try:
        yield
    finally:
        optimizer.__init__ = original  # type: ignore[method-assign]
    if created:
        raise IdentityViolation(
            "identity.optimizer_owned",
            f"{side} constructed an optimizer ({created[0]}) while building or scoring: a "
            "read-only scorer owns no optimizer",
            f"{side}:optimizer",
        )


def check_embedded(side: str, engine: Engine, frozen: FrozenInputs) -> bool:
    """The tokens the model itself embedded (its own record, not the scorer's echo) must be
    frozen tokens at their frozen positions; False when the engine keeps no such record."""
    record = engine.embedded_tokens()
    if record is None:
        return False
    rows = [
        dict(zip(p.tolist(), t.tolist(), strict=True))
        for t, p in zip(frozen.token_ids, frozen.position_ids, strict=True)
    ]
    for tokens, positions in record:
        width = tokens.shape[-1] if tokens.dim() > 1 else 1  # a decode step embeds one token
        for row_t, row_p in zip(
            tokens.reshape(-1, width).tolist(), positions.reshape(-1, width).tolist(), strict=True
        ):
            # Some frozen row must hold exactly these tokens at exactly these positions.
            if not any(all(r.get(p) == t for p, t in zip(row_p, row_t, strict=True)) for r in rows):
                raise IdentityViolation(
                    "identity.scored_other_tokens",
                    f"{side}'s model embedded tokens {row_t[:8]} at positions {row_p[:8]}, "
                    "which no frozen sample holds there (its echo of the input says otherwise)",
                    f"{side}:token_ids",
                )
    return True
