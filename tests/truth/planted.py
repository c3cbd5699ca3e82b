"""Planted drift: a runtime whose two sides are bitwise identical float32 scorers, except that
the side owning ``knob`` (training for knobs of both sides) adds ``OFFSET`` to every active
token in the one case where ``knob`` takes ``value``. Built on the cpu-smoke engines; every
knob is recorded as applied so that each allow-listed knob can carry the drift (the runtime
tests attribution, not engines).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import torch

from xconf.adapters.cpu_smoke.adapter import CpuSmokeRuntime
from xconf.adapters.cpu_smoke.engines import TrainingEngine
from xconf.adapters.cpu_smoke.side import TRAINING
from xconf.knobs import KNOBS
from xconf.runtime.protocol import RuntimeBinding, SideBinding, planned_application
from xconf.runtime.requests import batch_size_from_requests

OFFSET = 1.0  # past every contract threshold (bfloat16: 5e-2)
SINGLE = (("backend", "none"), ("rank", 0), ("world_size", 1))


class _Engine:
    def __init__(self, runtime: PlantedRuntime, binding: SideBinding, planted: bool) -> None:
        self._inner = TrainingEngine(
            runtime.model_config, "float32", "sdpa", readback=TRAINING.readback
        )
        self._values = {k.path: k.materialized for k in binding.knobs}
        self._side = binding.side
        self._runtime = runtime
        self._planted = planted
        self._requested: int | None = None

    def score(self, inputs: Any, identity: Any, batch_size: int, op: Any) -> Any:
        self._requested = batch_size
        score = self._inner.score(inputs, identity, batch_size, op)
        drift = self._planted or (
            self._runtime.knob == "batch.size" and batch_size == self._runtime.value
        )
        owner = (
            "rollout" if KNOBS[self._runtime.knob or "batch.size"].side == "rollout" else "training"
        )
        if self._side == owner and drift:  # the side that owns the knob carries its drift
            shifted = torch.where(inputs.active_mask, score.logprobs + OFFSET, score.logprobs)
            score = replace(score, logprobs=shifted)
        return score

    def readback(self) -> Mapping[str, Any]:
        requested = batch_size_from_requests(self._inner.request_sizes, self._requested)
        return {**self._values, "batch.size": requested}

    def reset_state(self) -> None:
        self._inner.reset_state()

    def embedded_tokens(self) -> None:
        return None  # the planted scores are not the model's: its record proves nothing

    def close(self) -> None:
        self._inner.close()


class PlantedRuntime(CpuSmokeRuntime):
    runtime_kind = "planted-drift"

    def __init__(self, knob: str | None = None, value: Any = None, **options: Any) -> None:
        super().__init__(**options)
        self.knob, self.value = knob, value

    def bind(self, case: Any, identity: Any) -> RuntimeBinding:
        knobs = case.case.knob_dict()
        sides = {}
        for side in ("rollout", "training"):
            apps = tuple(
                planned_application(path, side, value, value, "applied", "planted runtime")
                for path, value in sorted(knobs.items())
                if path != "logp.backend" and KNOBS[path].side in (side, "both")
            )
            dtype = knobs["rollout.dtype" if side == "rollout" else "training.compute_dtype"]
            sides[side] = SideBinding(side, apps, str(dtype), SINGLE)  # type: ignore[arg-type]
        return RuntimeBinding(
            self.runtime_kind, case.case.case_id, sides["rollout"], sides["training"], ()
        )

    def build_engine(self, binding: SideBinding, case: Any) -> Any:
        knobs = case.case.knob_dict()
        planted = self.knob not in (None, "batch.size") and knobs.get(self.knob) == self.value
        return _Engine(self, binding, planted)
