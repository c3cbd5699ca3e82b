"""What scored a case: runtime target and options, the scoring code's digest, engine versions.

All of it enters the execution key, so resume never reuses a verdict that another runtime,
other options, other adapter or operator code, or another vLLM / transformers / torch / native
kernel build produced; and all of it is recorded in actual.json, so an upgrade that rescored
everything is visible.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.metadata
import importlib.util
import inspect
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import xconf

XCONF_VERSION = "0.1.0"
PACKAGE_ROOT = Path(xconf.__file__).resolve().parent
# Code that scores, whatever the runtime: every adapter and every operator under xconf.
SCORING_TREES = ("adapters", "ops")
ENGINE_DISTRIBUTIONS = ("vllm", "transformers", "torch")


def _plain(value: Any) -> Any:
    """A JSON-able view of an option value (dataclasses as dicts, anything else as its repr)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _plain(dataclasses.asdict(value))
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return f"<{type(value).__module__}.{type(value).__qualname__}>"


def runtime_identity(adapter: Any) -> dict[str, Any]:
    """The adapter's ``_target_`` and its public options (its constructor's choices)."""
    cls = type(adapter)
    # Only the constructor's choices: other public attributes (per-run timings, caches) change
    # while the adapter runs and would make every execution key unique, so nothing resumes.
    params = inspect.signature(cls.__init__).parameters
    named = {n for n, p in params.items() if p.kind is not inspect.Parameter.VAR_KEYWORD}
    given = getattr(adapter, "constructed_with", None)  # set by runtime.loading
    options = (
        {str(k): _plain(v) for k, v in sorted(given.items()) if str(k) in named}
        if isinstance(given, Mapping)
        else {
            k: _plain(v)
            for k, v in sorted(vars(adapter).items())
            if not k.startswith("_") and k in named
        }
    )
    return {
        "target": f"{cls.__module__}:{cls.__qualname__}",
        "kind": getattr(adapter, "runtime_kind", None),
        "options": options,
    }


@functools.cache
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    del size, mtime_ns  # cache key only: an edited file gets a fresh digest
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _digest_files(paths: Iterable[Path]) -> str:
    h = hashlib.sha256()
    for path in sorted(set(paths)):
        st = path.stat()
        h.update(str(path.relative_to(path.anchor)).encode() + b"\0")
        h.update(_file_digest(str(path), st.st_size, st.st_mtime_ns).encode())
    return h.hexdigest()


def _class_sources(cls: type) -> list[Path]:
    found = []
    for klass in cls.__mro__:
        try:
            source = inspect.getsourcefile(klass)
        except TypeError:  # builtins
            continue
        if source:
            found.append(Path(source).resolve())
    return found


def _module_source(factory: str) -> list[Path]:
    module = factory.split(":", 1)[0]
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.origin or not os.path.isfile(spec.origin):
        return []
    return [Path(spec.origin).resolve()]


def code_digest(adapter: Any, operator_factories: Iterable[str]) -> dict[str, str]:
    """xconf's version and a digest of the runtime's and the operators' source files.

    The tree digest covers every adapter and operator module under xconf; runtimes and
    operators that live elsewhere (a plugin, a test runtime) add their own classes' files.
    """
    tree = [p.resolve() for name in SCORING_TREES for p in (PACKAGE_ROOT / name).rglob("*.py")]
    tree += [p for p in (PACKAGE_ROOT / "ops").rglob("*.cpp")]
    outside = _class_sources(type(adapter))
    for factory in operator_factories:
        outside += _module_source(factory)
    return {
        "xconf": XCONF_VERSION,
        "scoring_sources": _digest_files(tree),
        "runtime_sources": _digest_files(outside),
    }


def _distribution_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


@functools.cache
def native_kernel_build() -> str:
    """The native kernel's build key (source, compiler, flags, ISA), or why there is none."""
    from xconf.ops.logprob import native

    compiler = native._compiler()
    if compiler is None:
        return "unavailable: no C++ compiler"
    try:
        return native._build_key(compiler, "best")
    except Exception as exc:  # the key names the failure; it never stops a run
        return f"unavailable: {type(exc).__name__}"


def engine_versions() -> dict[str, str]:
    """Versions of the engines that may score: read from the installed metadata, no import."""
    import torch

    versions = {name: _distribution_version(name) for name in ENGINE_DISTRIBUTIONS}
    versions["torch"] = torch.__version__  # the imported build, e.g. 2.13.0+cpu
    versions["native_kernel"] = native_kernel_build()
    return versions
