"""``rollout.weight_sync=reload``: the rollout engine receives the scored weights the way an RL
loop's engine does, through vLLM's weight-update path, and the sync is proven.

Three checkpoints, all written by xconf as safetensors (never pickles) into a directory the
engine owns (removed when it closes):

- the **source**: the scored checkpoint under a recorded, deterministic perturbation
  (``PERTURBATION``: every floating tensor plus ``SOURCE_SCALE`` times seeded normal noise);
  the engine is *built* from it, so every weight it holds before the sync is wrong;
- the **transport**: every scored tensor cast to ``rollout.weight_sync_dtype`` (the weights
  as sent); ``lossless`` says whether the cast kept the scored bits (bfloat16 of a float32
  checkpoint does not);
- the **sent** file: the transport, less any tensor withheld (``withhold``: a planted stale
  parameter, tests only; with none withheld it is the transport file itself).
  ``collective_rpc("reload_weights", weights_path=...)`` sends it.

The proof (``SyncRecord.stale``): a second engine, built by ``load`` from the transport, is the
reference: what vLLM holds when it loads the weights as sent from disk, cast as the engine
holds them. Every parameter, buffer and linear layer's effective weight of every worker of
the synced engine is digested (``live_weights.parameter_digests``, the one reading of live
weights; vLLM's CPU platform packs linear weights into a kernel handle, seen only through
the forward) and compared with the reference's, name by name: any difference is a stale
tensor, named. The verdict therefore proves "live weights == the weights as sent", and
``lossless`` says whether those equal the scored checkpoint's bit for bit.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PERTURBATION = "xconf-perturb/1"
SOURCE_SEED = 0
SOURCE_SCALE = 0.01
WEIGHTS = "model.safetensors"
_MAX_WEIGHTS_BYTES = 1 << 40  # a bound on one weights file, not a limit any model meets


@dataclass(frozen=True)
class SyncFiles:
    """The checkpoints one synced engine is built from, sent and checked against."""

    root: Path  # the engine's own directory (removed when it closes)
    source: Path  # the perturbed checkpoint the engine is built from
    transport: Path  # every scored tensor in the transport dtype (the reference loads it)
    sent: Path  # what the sync sends: the transport, less any withheld tensor (or the transport)
    source_digest: str  # sha256 of the source's weights file (with the rule, its identity)
    transport_digest: str  # sha256 of the transport's weights file
    sent_digest: str
    lossless: bool  # the transport cast back equals every scored tensor bit for bit
    withheld: tuple[str, ...]
    # How the source came to be: the perturbation (``source_rule()``) or a given checkpoint
    # (the pre-update state W0 of a one-step identity: ``prepare(source=...)``).
    rule: str = ""


@dataclass(frozen=True)
class SyncRecord:
    """What one sync did, as read back from the live engine and its reference."""

    dtype: str  # the dtype the sent weights travelled in, from the sent file's tensors
    stale: tuple[str, ...]  # worker-qualified tensors that differ from the reference
    live_digest: str  # of every worker's parameters and buffers after the sync
    reference_digest: str  # the same, of the engine that loaded the transport from disk
    source_rule: str  # the perturbation, with its seed and scale
    source_digest: str
    sent_digest: str
    lossless: bool
    seconds: float  # the reload_weights call


def _scored_tensors(model_path: str) -> dict[str, Any]:
    from safetensors.torch import load_file

    from xconf.adapters.models.local import weight_files

    tensors: dict[str, Any] = {}
    for file in weight_files(Path(model_path)):
        tensors.update(load_file(str(file)))
    return tensors


def _checkpoint(scored: Path, out: Path, tensors: dict[str, Any], rule: str) -> str:
    """``out`` as a checkpoint: the scored one's JSON files (config, generation config;
    never its index) and ``tensors`` as one safetensors file; returns that file's sha256."""
    from xconf.artifacts.safe_io import publish_bytes
    from xconf.artifacts.tensor_file import tensor_parts

    out.mkdir(parents=True)
    for file in sorted(scored.glob("*.json")):
        if not file.name.endswith(".index.json"):
            shutil.copyfile(file, out / file.name)
    return publish_bytes(out, WEIGHTS, tensor_parts(tensors, {"xconf": rule}))


def validate(mode: str, dtype: str) -> None:
    """Refuse a weight sync or transport dtype this module does not implement."""
    from xconf.adapters.errors import UnsupportedKnobError
    from xconf.knobs import (
        ROLLOUT_WEIGHT_SYNC,
        ROLLOUT_WEIGHT_SYNC_DTYPE,
        WEIGHT_SYNC_LOAD,
        WEIGHT_SYNC_RELOAD,
    )

    if mode not in (WEIGHT_SYNC_LOAD, WEIGHT_SYNC_RELOAD):
        raise UnsupportedKnobError(
            "unsupported_value", f"weight sync {mode!r}", ROLLOUT_WEIGHT_SYNC.path
        )
    if dtype not in ("float32", "bfloat16"):
        raise UnsupportedKnobError(
            "unsupported_value", f"weight sync dtype {dtype!r}", ROLLOUT_WEIGHT_SYNC_DTYPE.path
        )


def source_rule() -> str:
    return f"{PERTURBATION} seed={SOURCE_SEED} scale={SOURCE_SCALE}"


def perturbed(tensors: dict[str, Any]) -> dict[str, Any]:
    """The source's tensors: each floating one plus seeded noise (per name: crc32), cast
    back to its dtype; deterministic on every CPU."""
    import torch

    out = {}
    for name, t in tensors.items():
        if not t.is_floating_point():
            out[name] = t
            continue
        g = torch.Generator().manual_seed(SOURCE_SEED * 2**32 + zlib.crc32(name.encode()))
        noise = torch.randn(t.shape, generator=g, dtype=torch.float32)
        out[name] = (t.float() + SOURCE_SCALE * noise).to(t.dtype)
    return out


def prepare(
    model_path: str, dtype: str, withhold: Sequence[str] = (), source: str | None = None
) -> SyncFiles:
    """Write the source, transport and sent checkpoints of one synced engine. ``source``: a
    checkpoint the engine is built from as it is (the pre-update state W0 of a one-step
    identity, ``adapters/hf/update_step.py``) instead of the perturbed scored one."""
    import torch

    from xconf.adapters.errors import UnsupportedKnobError
    from xconf.knobs import ROLLOUT_WEIGHT_SYNC_DTYPE

    scored = _scored_tensors(model_path)
    missing = sorted(set(withhold) - set(scored))
    if missing:
        raise UnsupportedKnobError(
            "unsupported_value",
            f"withheld tensors {missing} are not in the checkpoint",
            ROLLOUT_WEIGHT_SYNC_DTYPE.path,
        )
    wire = getattr(torch, dtype)
    transport = {n: t.to(wire) if t.is_floating_point() else t for n, t in scored.items()}
    lossless = all(torch.equal(transport[n].to(t.dtype), t) for n, t in scored.items())
    root = Path(tempfile.mkdtemp(prefix="xconf-weight-sync-"))
    try:
        src = Path(model_path)
        if source is None:
            rule = source_rule()
            source_digest = _checkpoint(src, root / "source", perturbed(scored), rule)
            source_path = root / "source"
        else:
            source_path, source_digest = Path(source), _weights_digest(Path(source))
            rule = f"pre-update checkpoint {source_path.name}"
        transport_digest = _checkpoint(src, root / "transport", transport, f"transport {dtype}")
        sent_path, sent_digest = root / "transport", transport_digest
        if withhold:  # otherwise the sent file is the transport: never written twice
            sent = {n: t for n, t in transport.items() if n not in set(withhold)}
            sent_path = root / "sent"
            sent_digest = _checkpoint(src, sent_path, sent, f"sent {dtype}")
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return SyncFiles(
        root,
        source_path,
        root / "transport",
        sent_path,
        source_digest,
        transport_digest,
        sent_digest,
        lossless,
        tuple(sorted(withhold)),
        rule,
    )


def _weights_digest(path: Path) -> str:
    """sha256 of a checkpoint's weight files, in order (one file: that file's sha256)."""
    from xconf.adapters.models.local import weight_files
    from xconf.artifacts.layout import sha256_file

    files = weight_files(path)
    # Streamed (a checkpoint is not read into memory); a snapshot may be a symlink farm.
    digests = [sha256_file(f, _MAX_WEIGHTS_BYTES, follow=True) for f in files]
    if len(digests) == 1:
        return digests[0]
    return hashlib.sha256("".join(digests).encode()).hexdigest()


def files_dtype(paths: Sequence[Path]) -> str:
    """The one dtype of the floating tensors in these safetensors files, from their headers
    (what travelled; ``mixed:...`` when they hold several)."""
    from xconf.artifacts.safetensors_header import FLOAT_NAMES, header_length, parse_header

    found: set[str] = set()
    for path in paths:
        with path.open("rb") as f:
            size = path.stat().st_size
            length = header_length(f.read(8), size, str(path))
            header = parse_header(f.read(length), size - 8 - length, str(path))
        found |= {FLOAT_NAMES[e.dtype] for e in header.entries.values() if e.dtype in FLOAT_NAMES}
    return found.pop() if len(found) == 1 else "mixed:" + ",".join(sorted(found))


def checkpoint_dtype(model_path: str) -> str:
    """The dtype a ``load`` engine's weights come from disk in: the checkpoint's."""
    from xconf.adapters.models.local import weight_files

    return files_dtype(weight_files(Path(model_path)))


def _combined(per_worker: list[list[tuple[str, str]]]) -> str:
    h = hashlib.sha256()
    for rank, digests in enumerate(per_worker):
        for name, digest in digests:
            h.update(f"{rank}\0{name}\0{digest}\n".encode())
    return h.hexdigest()


def stale_tensors(
    live: list[list[tuple[str, str]]], reference: list[list[tuple[str, str]]]
) -> tuple[str, ...]:
    """``rank:name`` of every tensor whose live digest is not the reference's (or that only
    one of the two holds)."""
    stale: list[str] = []
    if len(live) != len(reference):
        return (f"workers: {len(live)} live, {len(reference)} in the reference",)
    for rank, (a, b) in enumerate(zip(live, reference, strict=True)):
        ours, theirs = dict(a), dict(b)
        for name in sorted(set(ours) | set(theirs)):
            if ours.get(name) != theirs.get(name):
                stale.append(f"{rank}:{name}")
    return tuple(stale)


Digests = Callable[[Any], list[tuple[str, str]]]


def sync(
    llm: Any, files: SyncFiles, reference: list[list[tuple[str, str]]], digests: Digests
) -> SyncRecord:
    """Send ``files.sent`` into the live engine, then compare its tensors with the reference."""
    start = time.perf_counter()
    llm.collective_rpc("reload_weights", kwargs={"weights_path": str(files.sent)})
    seconds = time.perf_counter() - start
    live = [list(map(tuple, w)) for w in llm.collective_rpc(digests)]
    return SyncRecord(
        dtype=files_dtype([files.sent / WEIGHTS]),
        stale=stale_tensors(live, reference),
        live_digest=_combined(live),
        reference_digest=_combined(reference),
        source_rule=files.rule or source_rule(),
        source_digest=files.source_digest,
        sent_digest=files.sent_digest,
        lossless=files.lossless,
        seconds=seconds,
    )


def reference(
    cfg: Any, build: Callable[[Any], Any]
) -> tuple[SyncFiles, list[list[tuple[str, str]]]]:
    """The checkpoints of a synced engine (``cfg``: its ``RolloutEngineConfig``), and the
    reference it is checked against: each worker's tensor digests in an engine ``build``
    makes by loading the transport (the weights as sent) from disk."""
    from dataclasses import replace

    from xconf.adapters.vllm.live_weights import parameter_digests
    from xconf.knobs import WEIGHT_SYNC_LOAD

    files = prepare(
        cfg.model_path, cfg.weight_sync_dtype, cfg.weight_sync_withhold, cfg.weight_sync_source
    )
    loaded = replace(
        cfg,
        model_path=str(files.transport),
        tokenizer_path=cfg.tokenizer_path or cfg.model_path,
        weight_sync=WEIGHT_SYNC_LOAD,
        weight_sync_withhold=(),
    )
    try:
        with build(loaded) as engine:
            digests = engine.llm.collective_rpc(parameter_digests)
    except BaseException:
        shutil.rmtree(files.root, ignore_errors=True)
        raise
    return files, [list(map(tuple, w)) for w in digests]
