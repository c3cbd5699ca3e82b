"""One plan, reversed: what the order tests run beside the forward plan."""

from __future__ import annotations

from dataclasses import replace
from typing import Any


def reversed_plan(prepared: Any) -> Any:
    """Reversed twice over: the tuple the runner walks, and the index it sorts by within a
    group of cases that share a rollout engine (the sealed plan keeps its own rows)."""
    flipped = tuple(
        replace(c, case=replace(c.case, index=i))
        for i, c in enumerate(reversed(prepared.execution.cases))
    )
    return replace(prepared, execution=replace(prepared.execution, cases=flipped))
