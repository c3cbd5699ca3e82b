"""A side: the unit an engine package plugs in.

An engine package (``xconf/adapters/NAME/``) declares its sides once, in its ``side.py``:
``SIDES = {"rollout": ..., "training": ...}`` (one slot or both), each a :class:`SideSpec`
bundling what the side is made of: its typed settings (the one record a knob's value lands
in, each field's default the engine's own), its knob handlers, ``build``, the readings its
live state reports beside the knobs, the distributed context it runs in, and the scorer it
names. A runtime config pairs one rollout side with one training side by package name
(``conf/runtime/vllm_hf.yaml``: ``rollout: vllm``, ``training: hf``); ``runtime/pairing.py``
binds and builds through the two specs, so adding a side is one package and one YAML file.

The specs are found by name (:func:`resolve_side`, an import by string as
``runtime/loading.py`` imports a runtime): nothing below the adapters imports one.
"""

from __future__ import annotations

import importlib
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeAlias, TypeVar

from xconf.errors import ConfigError
from xconf.experiment import Identity
from xconf.knobs import KnobValue
from xconf.operators.catalog import SIDES, OperatorBinding, Side
from xconf.runtime.protocol import (
    Engine,
    Handlers,
    ReadbackFailure,
    ReadbackValue,
    SideBinding,
    knob_readback,
)

S = TypeVar("S")  # a side's settings record
M = TypeVar("M")  # what a pairing's two sides share (the model both of them score)
L = TypeVar("L")  # a side's live state, as its engine exposes it

# A side's distributed context as the binding records it: backend, rank, world size, ...
DistributedContext: TypeAlias = tuple[tuple[str, Any], ...]
# A side package: xconf/adapters/NAME/side.py
SIDE_PACKAGE = "xconf.adapters"
_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")


@dataclass(frozen=True)
class SideBuild(Generic[M]):
    """What a side's ``build`` gets beside its settings: the side's binding (its dtype and
    distributed context), the operator the case binds to it, and what the pairing shares."""

    binding: SideBinding
    operator: OperatorBinding
    shared: M

    @property
    def ranks(self) -> int:
        """Ranks the side runs on (its distributed context's world size)."""
        return int(dict(self.binding.distributed_context)["world_size"])


def readback_values(live: Mapping[str, Any]) -> dict[str, ReadbackValue]:
    """The readback values an engine reports: scalars (a finite float too: a temperature),
    None, layouts and failed reads."""
    from xconf.ops.logprob.contract import ShardingSpec

    kept = (bool, int, str, ShardingSpec, ReadbackFailure)
    return {
        k: v
        for k, v in live.items()
        if v is None or isinstance(v, kept) or (isinstance(v, float) and math.isfinite(v))
    }


@dataclass(frozen=True)
class SideSpec(Generic[S, M]):
    """One side of one engine package, declared once (``adapters/NAME/side.py``).

    ``settings``: the frozen record the side's engine is built from, one field per knob its
    handlers honour (named by ``runtime.settings.setting_name``; ``batch_size`` and
    ``logp_backend`` too), each field's default the engine's own: a knob the case does not
    declare, or one the side could not materialize, builds the default.
    ``handlers``: how the side honours each knob (``protocol.KnobHandler``); a knob without
    one is unsupported. ``build(settings, SideBuild)``: the engine (an engine wrapper may
    be put around it by the runtime; it forwards the whole ``protocol.Engine``).
    ``readings(live)``: what the side's live state reports beside its knobs
    (``runtime/readback`` names); with the handlers' readings it is the engine's
    ``readback`` (:meth:`readback`). ``context(knobs)``: the distributed context the side
    runs in for a case's knobs. ``scorer(identity, knobs)``: the scorer's name and version
    for a case (a knob may pick another scoring path: ``rollout.scoring_mode``).
    ``shared``: the type of what the side needs from its pairing (the checkpoint both sides
    score); two sides pair only when they need the same. ``max_cached``: engines of this
    side the engine cache keeps (1 where two cannot coexist in one process).
    ``distributions``: the installed distributions whose versions an attempt's validity
    depends on (the runtime's ``environment()`` records them). ``check(shared)``: what the
    side refuses of the shared model before a run writes anything (a checkpoint it cannot
    build raises a coded error naming the field); None: nothing beyond what the runtime
    checks.
    """

    name: str
    side: Side
    settings: type[S]
    handlers: Handlers
    build: Callable[[S, SideBuild[M]], Engine]
    readings: Callable[[Any], Mapping[str, Any]]
    context: Callable[[Mapping[str, KnobValue]], DistributedContext]
    scorer: Callable[[Identity, Mapping[str, KnobValue]], str]
    shared: type[M]
    max_cached: int = 4
    distributions: tuple[str, ...] = ()
    check: Callable[[M], None] | None = None

    def readback(self, live: Any) -> dict[str, ReadbackValue]:
        """What an engine of this side reports from its live state: its readings, and each
        knob of the side read by the knob's handler (the one way a knob's actual value is
        taken, on every side)."""
        return readback_values(
            {**self.readings(live), **knob_readback(self.handlers, self.side, live)}
        )


def side_packages() -> list[str]:
    """The packages under ``xconf/adapters`` that declare a side (have a ``side.py``)."""
    root = Path(__file__).resolve().parent.parent / "adapters"
    return sorted(p.parent.name for p in root.glob("*/side.py"))


def resolve_side(name: Any, slot: Side) -> SideSpec[Any, Any]:
    """The ``slot`` side the package ``name`` declares (``xconf/adapters/NAME/side.py``'s
    ``SIDES[slot]``); a name that is no side package, or a package without that slot, is a
    coded ``ConfigError`` naming ``runtime.<slot>``."""
    where = f"runtime.{slot}"
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigError(
            "runtime.bad_side",
            f"a side is named by its package (e.g. vllm, hf), got {name!r}",
            where,
        )
    try:
        module = importlib.import_module(f"{SIDE_PACKAGE}.{name}.side")
    except ModuleNotFoundError as exc:
        if exc.name not in (f"{SIDE_PACKAGE}.{name}", f"{SIDE_PACKAGE}.{name}.side"):
            raise  # the package exists and one of its own imports is missing
        raise ConfigError(
            "runtime.unknown_side",
            f"no side package '{name}'; available: {', '.join(side_packages())}",
            where,
        ) from exc
    sides: Mapping[Side, SideSpec[Any, Any]] | None = vars(module).get("SIDES")
    if not isinstance(sides, Mapping):
        raise ConfigError("runtime.bad_side", f"{module.__name__} declares no SIDES mapping", where)
    spec = sides.get(slot)
    if spec is None:
        has = ", ".join(s for s in SIDES if s in sides) or "none"
        raise ConfigError(
            "runtime.no_such_side", f"the {name} package has no {slot} side (it has: {has})", where
        )
    return spec
