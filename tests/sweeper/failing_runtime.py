"""A runtime whose construction raises for one batch size: a job that dies inside a sweep."""

from __future__ import annotations

from typing import Any

from xconf.adapters.cpu_smoke.adapter import CpuSmokeRuntime


class FailingConstructionRuntime(CpuSmokeRuntime):
    def __init__(self, fail_on_batch_size: int, **options: Any) -> None:
        super().__init__(**options)
        self.fail_on_batch_size = fail_on_batch_size

    def bind(self, case, identity):  # type: ignore[no-untyped-def]
        if case.case.knob_dict()["batch.size"] == self.fail_on_batch_size:
            raise RuntimeError("injected construction failure")
        return super().bind(case, identity)


class ExitingRuntime(CpuSmokeRuntime):
    """Kills its own process for one batch size: a job that dies without a word."""

    def __init__(self, exit_on_batch_size: int, **options: Any) -> None:
        super().__init__(**options)
        self.exit_on_batch_size = exit_on_batch_size

    def bind(self, case, identity):  # type: ignore[no-untyped-def]
        if case.case.knob_dict()["batch.size"] == self.exit_on_batch_size:
            import os

            os._exit(7)
        return super().bind(case, identity)
