"""Guards around one side's scoring call: its own copy of the frozen inputs, checked after.

Each side scores a private copy of the frozen tensors, so a runtime that writes into its input
cannot change what the runner compares against or what the other side sees. After the call
the copy must still equal the identity, and the identity digest recomputed from what the side
echoes must equal the digest recorded in identity.json; otherwise the side did not score the
frozen input and the case is ``invalid_identity``, with the evidence.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from xconf.errors import IdentityViolation
from xconf.experiment import Identity
from xconf.runtime.protocol import FrozenInputs, SideScore

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
