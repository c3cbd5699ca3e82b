"""Where the vLLM rollout engine runs inside the launched world.

The launched world has the larger side's ranks (:func:`xconf.knobs.side_worlds`); the rollout
engine occupies ranks ``0 .. size - 1`` of it: one TP rank per launcher rank through vLLM's
external launcher when the world is the TP group, otherwise an engine on rank 0 alone.
"""

from __future__ import annotations


def rollout_executor(tp: int, world: int) -> tuple[str, bool, str]:
    """(executor, engine core in-process?, evidence) for a rollout TP inside a launcher world."""
    if world > 1 and tp == world:
        return (
            "external_launcher",
            True,
            f"vLLM external_launcher: one TP rank per launcher rank ({world})",
        )
    if world > 1:
        return (
            "auto",
            False,
            f"engine core in its own process on rank 0 of the {world}-rank launched world",
        )
    if tp == 1:
        return "auto", True, "in-process engine"
    return "auto", True, "multiprocess executor, one worker per TP rank"
