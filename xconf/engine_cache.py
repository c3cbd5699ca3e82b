"""Engines reused across the cases of one run, by side and construction fingerprint."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping

from xconf.execution_plan import ExecutionCase
from xconf.operators.catalog import SIDES
from xconf.runtime.protocol import Engine, RuntimeAdapter, SideBinding


class EngineCache:
    """Engines keyed by side and every reuse-relevant fingerprint; least recently used evicted.

    ``capacity`` is engines kept per side (an int, or a mapping side -> int). Eviction happens
    before a new engine is built, so a runtime whose engines cannot coexist (in-process vLLM
    shares process-wide state) never holds two at once. A reused engine's ``reset_state`` (a
    required method of every engine, forwarded by every wrapper) runs before it is handed to
    the next case, so no score depends on the cases scored before it.
    """

    def __init__(self, adapter: RuntimeAdapter, capacity: int | Mapping[str, int] = 4) -> None:
        self._adapter = adapter
        self._capacity = {
            side: capacity if isinstance(capacity, int) else int(capacity.get(side, 4))
            for side in SIDES
        }
        self._engines: dict[str, OrderedDict[tuple[str, ...], Engine]] = {
            s: OrderedDict() for s in SIDES
        }
        self.built = 0
        self.reused = 0

    def get(self, binding: SideBinding, case: ExecutionCase) -> Engine:
        key = (*binding.reuse_key(), case.operator(binding.side).descriptor_fingerprint)
        engines = self._engines[binding.side]
        if key in engines:
            engines.move_to_end(key)
            self.reused += 1
            engines[key].reset_state()  # what it kept for the cases before reaches no other
            return engines[key]
        while engines and len(engines) >= self._capacity[binding.side]:
            _, evicted = engines.popitem(last=False)
            evicted.close()
        engine = self._adapter.build_engine(binding, case)
        self.built += 1
        engines[key] = engine
        return engine

    def close(self) -> None:
        for engines in self._engines.values():
            for engine in engines.values():
                engine.close()
            engines.clear()
