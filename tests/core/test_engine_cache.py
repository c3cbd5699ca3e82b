"""The engine cache resets a reused engine through every wrapper a runtime puts around it.

The cache calls ``reset_state`` on the object it holds, which on the real runtimes is a
wrapper (the timer around the placement on a side's ranks around the side's engine); the
reset must reach the engine underneath, or a reused engine scores with the state the cases
before it left (a filled prefix cache).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from xconf.adapters.cpu_smoke.engines import RolloutEngine
from xconf.adapters.cpu_smoke.model import SyntheticModelConfig
from xconf.adapters.cpu_smoke.side import ROLLOUT
from xconf.config.strict import parse_experiment
from xconf.engine_cache import EngineCache
from xconf.execution_plan import ExecutionCase, build_execution_plan
from xconf.operators.catalog import ResolutionPolicy, SemanticOperatorCatalog
from xconf.planner import plan_experiment
from xconf.runtime.protocol import Engine, SideBinding
from xconf.runtime.wrappers import Delegating, OnSideRanks
from xconf.side_scoring import frozen_inputs
from xconf.testing.smoke_ops import register_smoke_operators


def _timed(engine: Engine) -> Engine:
    from xconf.adapters.checkpoint.runtime import Timed

    return Timed(engine, {"scoring_s": 0.0})


def _on_rank0(engine: Engine) -> Engine:
    return OnSideRanks.on(1, lambda _group: engine)


# Every wrapper the runtimes build, alone and nested as the checkpoint runtimes nest them.
WRAPPERS: dict[str, Callable[[Engine], Engine]] = {
    "delegating": Delegating,
    "on_side_ranks": _on_rank0,
    "timed": _timed,
    "timed(on_side_ranks)": lambda engine: _timed(_on_rank0(engine)),
}


def _prefix_caching_engine() -> RolloutEngine:
    return RolloutEngine(
        SyntheticModelConfig(),
        "float32",
        prefix_caching=True,
        eager=True,
        mode="decode",
        readback=ROLLOUT.readback,
    )


class _Builds:
    """The one thing the cache asks of a runtime: build an engine for a side."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def build_engine(self, binding: SideBinding, case: ExecutionCase) -> Engine:
        return self.engine


@pytest.fixture
def cached_case(s0_doc) -> tuple[Any, ExecutionCase, SideBinding]:
    spec = parse_experiment(s0_doc)
    plan = plan_experiment(spec)
    catalog = SemanticOperatorCatalog.from_entry_points()
    register_smoke_operators(catalog)
    policy = ResolutionPolicy(allow_smoke_operators=True)
    case = build_execution_plan(plan, catalog, policy).cases[0]
    return spec.identity, case, SideBinding("rollout", (), "float32", ())


def _reused_after_a_score(wrap: Callable[[Engine], Engine], cached_case: Any) -> RolloutEngine:
    """A prefix-caching engine, wrapped, scored once and then handed out again by the cache."""
    identity, case, binding = cached_case
    inner = _prefix_caching_engine()
    cache = EngineCache(_Builds(wrap(inner)))  # type: ignore[arg-type]
    engine = cache.get(binding, case)
    engine.score(frozen_inputs(identity), identity, 1, None)
    assert inner._prefix_cache, "the scored pass must fill the prefix cache"
    # the model's own record of what it embedded reaches the guards through the wrapper too
    assert engine.embedded_tokens() == inner.embedded_tokens() != []
    assert cache.get(binding, case) is engine and cache.reused == 1
    return inner


@pytest.mark.parametrize("wrap", WRAPPERS.values(), ids=WRAPPERS.keys())
def test_the_reset_reaches_the_engine_through_every_wrapper(wrap, cached_case) -> None:
    inner = _reused_after_a_score(wrap, cached_case)
    assert not inner._prefix_cache and inner.prefix_hits == 0


class _DropsTheReset(Delegating):
    """A wrapper that forwards everything but the reset: the engine keeps its cache."""

    def reset_state(self) -> None:
        return None


def test_a_wrapper_that_drops_the_reset_is_caught(cached_case) -> None:
    """The check above fails for a wrapper that does not forward the reset."""
    inner = _reused_after_a_score(_DropsTheReset, cached_case)
    assert inner._prefix_cache


class _Forgets:
    """A wrapper without ``reset_state``: no engine by the protocol, and the cache says so
    when it reuses it (the reset is called, never looked up)."""

    def __init__(self, inner: Engine) -> None:
        self._inner = inner

    def score(self, *args: Any) -> Any:
        return self._inner.score(*args)

    def readback(self) -> Any:
        return self._inner.readback()

    def embedded_tokens(self) -> Any:
        return self._inner.embedded_tokens()

    def close(self) -> None:
        self._inner.close()


def test_a_wrapper_without_the_reset_is_no_engine(cached_case) -> None:
    _, case, binding = cached_case
    inner = _prefix_caching_engine()
    assert isinstance(inner, Engine) and not isinstance(_Forgets(inner), Engine)
    cache = EngineCache(_Builds(_Forgets(inner)))  # type: ignore[arg-type]
    cache.get(binding, case)
    with pytest.raises(AttributeError, match="reset_state"):
        cache.get(binding, case)
