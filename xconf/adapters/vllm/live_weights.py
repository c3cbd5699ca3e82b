"""What a vLLM worker's loaded model holds, read inside each worker (``collective_rpc``):
the one reading of live weights, whole (``worker_weight_digest``: a score's read-only
evidence) or tensor by tensor (``parameter_digests``: a weight sync's proof,
``weight_sync.py``)."""

from __future__ import annotations

import hashlib
from typing import Any


def _effective_weights(model: Any) -> list[tuple[str, Any]]:
    """What each linear layer (and embedding used as a head) multiplies by, as its forward
    computes it: the layer applied to the identity, without bias. vLLM's CPU platform packs
    linear weights into a kernel handle and leaves an empty parameter behind
    (``dispatch_cpu_unquantized_gemm``): only the forward still sees the weight. Exact: each
    output is one weight times 1 plus zeros."""
    import torch

    out = []
    with torch.no_grad():
        for name, module in sorted(model.named_modules(), key=lambda kv: kv[0]):
            method, width = getattr(module, "quant_method", None), None
            weight = getattr(module, "weight", None)
            if method is not None and hasattr(method, "apply") and weight is not None:
                width = getattr(module, "input_size_per_partition", None)
            if not isinstance(width, int) or method is None or weight is None:
                continue
            eye = torch.eye(width, dtype=weight.dtype, device=weight.device)
            out.append((f"effective:{name}", method.apply(module, eye, None)))
    return out


def _live_tensors(worker: Any, buffers: bool) -> list[tuple[str, bytes]]:
    """A vLLM worker's loaded (rank-local) parameters, and with ``buffers`` its buffers
    (``buffer:NAME``) and every linear layer's effective weight (``effective:NAME``:
    ``_effective_weights``) too, each as its bytes, sorted by name: the one reading of live
    weights."""
    import torch

    model = worker.model_runner.model
    named = list(model.named_parameters())
    if buffers:
        named += [(f"buffer:{n}", b) for n, b in model.named_buffers()]
        named += _effective_weights(model)
    return [
        (name, p.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes())
        for name, p in sorted(named, key=lambda kv: kv[0])
    ]


def worker_weight_digest(worker: Any) -> str:
    """Runs in each vLLM worker: digest of the loaded (rank-local) weights."""
    h = hashlib.sha256()
    for name, data in _live_tensors(worker, buffers=False):
        h.update(name.encode())
        h.update(data)
    return h.hexdigest()


def parameter_digests(worker: Any) -> list[tuple[str, str]]:
    """Runs in each vLLM worker: each parameter's, buffer's and effective weight's digest, by
    name (a weight sync's proof: ``weight_sync.stale_tensors``)."""
    return [(name, hashlib.sha256(data).hexdigest()) for name, data in _live_tensors(worker, True)]
