"""Test runtimes for the resource-fault campaign, instantiated from `_target_` strings.

Both wrap the cpu-smoke runtime and misbehave only for cases whose requested knobs include
``fault_knob=fault_value`` (default: rollout.dtype=bfloat16): `RaisingRuntime` raises in the
middle of rollout scoring, `SleepyRuntime` hangs there (sleeping, or spinning in Python).
"""

from __future__ import annotations

import time
from typing import Any

from xconf.adapters.cpu_smoke.adapter import CpuSmokeRuntime

INJECTED = "injected fault: the rollout engine lost its device mid-score"


class _Faulty:
    def __init__(self, engine: Any, fault: Any) -> None:
        self._engine = engine
        self._fault = fault

    def score(self, *args: Any, **kwargs: Any) -> Any:
        self._fault()
        return self._engine.score(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)


class _FaultyRuntime(CpuSmokeRuntime):
    def __init__(
        self,
        fault_knob: str = "rollout.dtype",
        fault_value: Any = "bfloat16",
        **options: Any,
    ) -> None:
        super().__init__(**options)
        self.fault_knob = fault_knob
        self.fault_value = fault_value

    def build_engine(self, binding: Any, case: Any) -> Any:
        engine = super().build_engine(binding, case)
        if binding.side == "rollout" and case.case.knob_dict().get(self.fault_knob) == (
            self.fault_value
        ):
            return _Faulty(engine, self.fault)
        return engine

    def fault(self) -> None:
        raise NotImplementedError


class RaisingRuntime(_FaultyRuntime):
    def fault(self) -> None:
        raise RuntimeError(INJECTED)


class SleepyRuntime(_FaultyRuntime):
    """Hangs for ``hang_s`` seconds: ``mode`` "sleep" (a system call) or "spin" (Python)."""

    def __init__(self, hang_s: float = 600.0, mode: str = "sleep", **options: Any) -> None:
        super().__init__(**options)
        self.hang_s = hang_s
        self.mode = mode

    def fault(self) -> None:
        end = time.monotonic() + self.hang_s
        if self.mode == "sleep":
            time.sleep(self.hang_s)
        while time.monotonic() < end:
            pass


class HeldRuntime(CpuSmokeRuntime):
    """Holds the case whose requested ``batch.size`` is ``hold_batch_size`` while the file
    ``hold`` exists: it writes ``<hold>.<pid>.started`` (the test's cue to send a signal),
    then sleeps until the file is gone. The same command therefore resumes unchanged once
    the test removes the file."""

    def __init__(self, hold: str, hold_batch_size: int = 2, **options: Any) -> None:
        super().__init__(**options)
        self.hold = hold
        self.hold_batch_size = hold_batch_size

    def build_engine(self, binding: Any, case: Any) -> Any:
        import os
        from pathlib import Path

        hold = Path(self.hold)
        if case.case.knob_dict().get("batch.size") == self.hold_batch_size and hold.exists():
            # The Slurm job id, where there is one: the fault tests scancel it.
            # "<array>_<task> <raw id>": scancel takes the first, slurmstepd shows the second.
            raw = os.environ.get("SLURM_JOB_ID", "")
            array = os.environ.get("SLURM_ARRAY_JOB_ID")
            task = os.environ.get("SLURM_ARRAY_TASK_ID")
            job = f"{array}_{task} {raw}" if array and task else (f"{raw} {raw}" if raw else "")
            Path(f"{hold}.{os.getpid()}.started").write_text(job, "utf-8")
            while hold.exists():
                time.sleep(0.05)
        return super().build_engine(binding, case)
