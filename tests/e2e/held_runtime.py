"""A cpu-smoke runtime that holds one case's rollout engine build while a file exists, so a
test can read what a run has printed so far while it is still running."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from xconf.adapters.cpu_smoke.adapter import CpuSmokeRuntime


class HeldBuild(CpuSmokeRuntime):
    """Holds the rollout engine build of the case labelled ``hold_label`` while ``hold``
    exists, after writing ``<hold>.started`` (the test's cue)."""

    def __init__(self, hold: str, hold_label: str, **options: Any) -> None:
        super().__init__(**options)
        self.hold = hold
        self.hold_label = hold_label

    def build_engine(self, binding: Any, case: Any) -> Any:
        hold = Path(self.hold)
        if binding.side == "rollout" and case.case.label() == self.hold_label and hold.exists():
            Path(f"{hold}.started").write_text("", "utf-8")
            while hold.exists():
                time.sleep(0.05)
        return super().build_engine(binding, case)
