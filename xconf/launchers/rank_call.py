"""What a launched rank runs, as JSON: an importable target and JSON-serialisable arguments.

The parent hands each rank a job description (``module:qualname`` plus JSON), never a pickle:
a rank imports the target by name and calls it; nothing it receives can carry code. A Hydra
task function is described the same way: a module-level function by its name, a callable
object (``HydraTask``, a bound ``__call__``) by its importable class and its attributes, which
must be JSON and come back equal. Anything else (a lambda, a closure, an object holding
non-JSON state) is refused in the parent with ``launch.task.not_describable``.
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys
from collections.abc import Callable, Mapping
from typing import Any

from xconf.launchers.errors import LaunchError

PATH = "hydra.launcher"


def _refused(what: str, why: str) -> LaunchError:
    return LaunchError(
        "launch.task.not_describable",
        f"{what} cannot be handed to a rank as an importable target: {why}",
        PATH,
    )


def to_json(value: Any, what: str) -> str:
    """``value`` as JSON text that reads back equal (tuples, bytes or objects do not)."""
    try:
        text = json.dumps(value, allow_nan=True, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise _refused(what, f"not JSON ({exc})") from None
    if json.loads(text) != value:
        raise _refused(what, "does not read back equal from JSON (a tuple or a non-str key?)")
    return text


def import_target(target: str) -> Any:
    """The object named ``module:qualname`` (imported; attributes followed along the dots)."""
    module_name, sep, qualname = target.partition(":")
    if not sep or not module_name or not qualname or "<" in qualname:
        raise _refused(repr(target), "expected 'module:qualname' of a module-level object")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise _refused(repr(target), f"{type(exc).__name__}: {exc}") from None
    return obj


def _module_of(obj: Any) -> str:
    """The name ``obj``'s module can be imported by; ``__main__`` run with ``-m`` is named
    by its spec, a script stays ``__main__`` (spawned ranks re-import it as such)."""
    name = str(obj.__module__)
    if name == "__main__":
        spec = getattr(sys.modules["__main__"], "__spec__", None)
        if spec is not None and spec.name:
            return str(spec.name)
    return name


def target_of(obj: Any) -> tuple[str, bool]:
    """``module:qualname`` of a module-level function or class, checked by importing it, and
    whether that name holds a decorator's wrapper around ``obj`` (``@hydra.main``)."""
    qualname = getattr(obj, "__qualname__", None)
    if qualname is None or "<" in qualname:  # <lambda>, <locals>
        raise _refused(repr(obj), "not defined at module level")
    target = f"{_module_of(obj)}:{qualname}"
    # The check looks where ``obj`` lives: ``python -m pkg.mod`` runs pkg.mod as __main__,
    # and importing pkg.mod here would make a second copy of every object in it.
    found = import_target(f"{obj.__module__}:{qualname}")
    if found is obj:
        return target, False
    if inspect.unwrap(found) is obj:
        return target, True
    raise _refused(repr(obj), f"{target} names another object")


def describe(fn: Callable[..., Any]) -> dict[str, Any]:
    """A JSON description of ``fn`` that :func:`rebuild` turns back into a callable."""
    if inspect.ismethod(fn):
        owner, method = fn.__self__, fn.__func__.__name__
    elif inspect.isfunction(fn):
        target, wrapped = target_of(fn)
        return {"function": target, "unwrap": wrapped}
    elif callable(fn) and not isinstance(fn, type):
        owner, method = fn, "__call__"
    else:
        raise _refused(repr(fn), "not a function or a callable object")
    if isinstance(owner, type):
        raise _refused(repr(fn), "a class method")
    state = getattr(owner, "__dict__", None)
    if state is None:
        raise _refused(repr(fn), "its object has no attribute dictionary")
    cls, wrapped = target_of(type(owner))
    if wrapped:
        raise _refused(repr(fn), f"{cls} names a wrapper of its class")
    # Attributes that are functions (a task wrapping another task) are described in turn.
    callables = {k: describe(v) for k, v in state.items() if _is_function(v)}
    plain = {k: v for k, v in state.items() if k not in callables}
    return {
        "class": cls,
        "method": method,
        "state": json.loads(to_json(plain, f"the state of {type(owner).__name__}")),
        "callables": callables,
    }


def _is_function(value: Any) -> bool:
    return inspect.isfunction(value) or inspect.ismethod(value)


def rebuild(description: Mapping[str, Any]) -> Callable[..., Any]:
    """The callable :func:`describe` described: imported by name, state set from JSON."""
    if "function" in description:
        fn = import_target(str(description["function"]))
        return inspect.unwrap(fn) if description.get("unwrap") else fn
    cls = import_target(str(description["class"]))
    if not isinstance(cls, type):
        raise _refused(str(description["class"]), "not a class")
    new: Any = cls.__new__  # no __init__: the state comes from the description
    owner = new(cls)
    owner.__dict__.update(description["state"])
    owner.__dict__.update({k: rebuild(v) for k, v in description.get("callables", {}).items()})
    method: Callable[..., Any] = getattr(owner, str(description["method"]))
    return method
