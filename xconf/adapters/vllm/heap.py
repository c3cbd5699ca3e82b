"""The garbage collector while an in-process vLLM engine lives: one freeze, no full collections.

vLLM manages the collector for a server that builds one engine and serves for hours: every
engine build freezes the whole heap (after three collections, the last one full) and every
shutdown unfreezes it and collects it in full, more than once. In an xconf run an engine is
built and closed per construction fingerprint, and the process holds torch, transformers and
vLLM (about 700,000 tracked objects), so each full collection costs about 0.3 s of CPU time
on the critical path: four or five per engine, a third of an S2 run's wall time on the tiny
model.

xconf keeps the same two guarantees with one cheap freeze instead:

* the heap that exists before the engine (modules, the run's records) is frozen when the
  engine starts to build, so vLLM's collections scan only what came after it;
* vLLM's own ``gc.freeze``/``gc.unfreeze`` calls are skipped while xconf builds or shuts the
  engine down, so the engine's objects (weights, KV caches) are never frozen: the
  collections at shutdown, vLLM's and the one in :func:`released`, free them, and device
  memory is emptied after them as vLLM does;
* when the engine is closed the heap is unfrozen again, so garbage that was frozen meanwhile
  is collected by the collector's normal schedule; nothing stays frozen between engines.

Nothing here touches the arithmetic of any score; only when memory is reclaimed.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

_frozen_engines = 0  # live engines that hold the heap frozen (at most one in-process)


@contextlib.contextmanager
def vllm_gc_calls_skipped() -> Iterator[None]:
    """While vLLM builds or shuts down: its freeze and unfreeze do nothing (collect still runs)."""
    freeze, unfreeze = gc.freeze, gc.unfreeze
    gc.freeze = _skipped  # type: ignore[assignment]
    gc.unfreeze = _skipped  # type: ignore[assignment]
    try:
        yield
    finally:
        gc.freeze, gc.unfreeze = freeze, unfreeze


def _skipped() -> None:
    return None


def hold() -> None:
    """An engine starts to build: freeze what exists now (cheap: no collection)."""
    global _frozen_engines
    if _frozen_engines == 0:
        gc.freeze()
    _frozen_engines += 1


def released() -> None:
    """An engine is gone (closed, or its build failed): collect what it left, then unfreeze."""
    global _frozen_engines
    if _frozen_engines == 0:
        return
    gc.collect()  # only the objects created since the freeze: the engine's own
    _frozen_engines -= 1
    if _frozen_engines == 0:
        gc.unfreeze()
