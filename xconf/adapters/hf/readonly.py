"""Read-only guards for the training scorer: state digests and module-mode snapshots."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from xconf.adapters.errors import ReadOnlyViolationError


def _local(t: Any) -> Any:
    """The rank-local data of a tensor (FSDP2 parameters are DTensors)."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def _tensor_digest(named: Any) -> str:
    import torch

    h = hashlib.sha256()
    for name, tensor in named:
        local = _local(tensor.detach()).contiguous().cpu()
        h.update(name.encode())
        h.update(str(local.dtype).encode())
        h.update(str(tuple(local.shape)).encode())
        if local.numel():
            h.update(local.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


@dataclass(frozen=True)
class StateDigest:
    """Rank-local digests of every parameter and buffer, plus which parameters hold grads."""

    parameters: str
    buffers: str
    grads: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"parameters": self.parameters, "buffers": self.buffers, "grads": list(self.grads)}


def state_digest(model: Any) -> StateDigest:
    params = sorted(model.named_parameters(), key=lambda kv: kv[0])
    buffers = sorted(model.named_buffers(), key=lambda kv: kv[0])
    grads = tuple(n for n, p in params if p.grad is not None)
    return StateDigest(_tensor_digest(params), _tensor_digest(buffers), grads)


def mode_snapshot(model: Any) -> tuple[tuple[str, bool], ...]:
    return tuple((name, bool(m.training)) for name, m in model.named_modules())


def restore_modes(model: Any, snapshot: tuple[tuple[str, bool], ...]) -> None:
    modules = dict(model.named_modules())
    for name, training in snapshot:
        modules[name].training = training


def check_unchanged(before: StateDigest, after: StateDigest, where: str) -> None:
    if before.parameters != after.parameters:
        raise ReadOnlyViolationError(
            "parameters_changed", "a parameter changed while scoring", where
        )
    if before.buffers != after.buffers:
        raise ReadOnlyViolationError("buffers_changed", "a buffer changed while scoring", where)
    if before.grads != after.grads:
        raise ReadOnlyViolationError("grads_changed", "scoring created or dropped gradients", where)
