"""What crosses to a launched rank is a name and JSON (`xconf.launchers.rank_call`), never a
pickle: describing and rebuilding task functions, and refusing what cannot be named."""

from __future__ import annotations

import ast
import functools
import json
from pathlib import Path
from typing import Any

import pytest

from xconf.launchers.errors import LaunchError
from xconf.launchers.rank_call import describe, import_target, rebuild, to_json

REPO = Path(__file__).resolve().parents[2]


def plain_task(cfg: Any) -> str:
    return f"plain {cfg}"


def _decorate(fn: Any) -> Any:
    @functools.wraps(fn)
    def wrapper(cfg: Any = None) -> Any:
        return fn(cfg)

    return wrapper


def wrapped_task(cfg: Any) -> str:
    return f"inner {cfg}"


# As @hydra.main leaves it: the module's name holds the wrapper, Hydra calls the inner task.
inner_task = wrapped_task
wrapped_task = _decorate(wrapped_task)  # type: ignore[assignment]


class StatefulTask:
    def __init__(self, prefix: str, inner: Any = None) -> None:
        self.prefix = prefix
        self.inner = inner
        self.counts = {"calls": 0}

    def __call__(self, cfg: Any) -> str:
        inner = self.inner(cfg) if self.inner is not None else ""
        return f"{self.prefix} {cfg} {self.counts} {inner}".strip()


def _through_json(fn: Any) -> Any:
    return rebuild(json.loads(json.dumps(describe(fn))))


def test_module_function_and_callable_object_round_trip() -> None:
    assert _through_json(plain_task)("x") == "plain x"
    task = StatefulTask("p", inner=plain_task)
    assert _through_json(task)("x") == task("x") == "p x {'calls': 0} plain x"
    assert _through_json(task.__call__)("y") == task("y")
    # The inner task is named by its wrapper's name, and unwrapped again in the rank.
    assert describe(inner_task) == {"function": f"{__name__}:wrapped_task", "unwrap": True}
    assert _through_json(inner_task) is inner_task
    assert describe(plain_task) == {"function": f"{__name__}:plain_task", "unwrap": False}


def test_what_cannot_be_named_or_is_not_json_is_refused() -> None:
    def closure(cfg: Any) -> Any:
        return cfg

    # A tuple is refused because it reads back from JSON as a list.
    refused: list[Any] = [
        closure,
        lambda cfg: cfg,
        StatefulTask("p", inner=closure),
        StatefulTask(b"bytes"),  # type: ignore[arg-type]
        StatefulTask(("a", "tuple")),  # type: ignore[arg-type]
        StatefulTask,
    ]
    for fn in refused:
        with pytest.raises(LaunchError) as info:
            describe(fn)
        assert info.value.code == "launch.task.not_describable", fn
        assert info.value.path == "hydra.launcher"


def test_targets_are_names_only() -> None:
    assert import_target("json:dumps") is json.dumps
    for bad in ("json", "json:", ":dumps", "json:<lambda>", "no_such_module_xyz:f", "json:nope"):
        with pytest.raises(LaunchError) as info:
            import_target(bad)
        assert info.value.code == "launch.task.not_describable"
    with pytest.raises(LaunchError):
        to_json({"k": float}, "kwargs")


def test_no_pickle_in_the_launchers() -> None:
    """Nothing under xconf/launchers or the launcher plugins imports a pickle module."""
    found = []
    for root in (REPO / "xconf" / "launchers", REPO / "hydra_plugins"):
        for path in root.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text("utf-8"))):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    names = [node.module or ""]
                found += [f"{path}: {n}" for n in names if "pickle" in n.split(".")[0]]
    assert found == []
