"""Runtime adapters from their config group: ``conf/runtime/<name>.yaml`` plus overrides.

The adapter is built with ``hydra.utils.instantiate`` (``_target_`` names its class; the
core never imports an adapter module). Its options are checked against the class's
signature first, so an option the adapter does not take (``+runtime.model_path=x``) is a
coded ``runtime.unknown_option`` naming the key (exit 2), never a ``TypeError`` traceback.

The one owner of runtime resolution. A runtime is named, never located: its name must be
one of the installed package's own catalog (``conf/runtime/*.yaml``, :func:`runtime_names`),
so a name read from a run directory (``materialized.json``'s ``runtime_kind``) cannot be a
path to a YAML file of the directory's choosing. Options are data: a Hydra key
(``_target_``, ``_args_``, ``_partial_``, ...) or an interpolation nested in an option is
refused (``runtime.reserved_key``, ``runtime.interpolation``), so no option can make
``instantiate`` build or resolve anything but the catalog's class.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import inspect
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from xconf.errors import ConfigError, XconfError

# Keys a runtime config may hold that are not constructor options.
NON_OPTION_KEYS = ("_target_", "name")
# The keys hydra.utils.instantiate acts on: in an option they would choose code or arguments.
HYDRA_KEYS = frozenset({"_target_", "_args_", "_recursive_", "_convert_", "_partial_"})
# The options that say which runtime a config is, beside its class: the sides it pairs (and
# the kind it records). Data never sets them: they are the catalog config's own.
PAIRING_OPTIONS = ("rollout", "training", "kind")
# A catalog name: a file name of conf/runtime/, never a path (no '/', no '.', no '..').
_RUNTIME_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
_ABSENT = object()


def hydra_target(target: str) -> str:
    """``"pkg.module:Class"`` (xconf's spelling) as Hydra's dotted ``"pkg.module.Class"``."""
    return target.replace(":", ".")


def runtime_names(conf_root: Path) -> tuple[str, ...]:
    """The catalog: the runtime names ``<conf_root>/runtime/`` ships (``cpu_smoke``, ...)."""
    folder = conf_root / "runtime"
    return tuple(
        sorted(
            p.stem
            for p in folder.glob("*.yaml")
            if _RUNTIME_NAME.fullmatch(p.stem) and not p.is_symlink() and p.is_file()
        )
    )


def catalog_name(conf_root: Path, name: Any) -> str:
    """``name`` as the catalog spells it (``cpu-smoke`` is ``cpu_smoke``), or a coded
    ``config.unknown_runtime``: anything else (a path, ``..``, a name the catalog lacks)."""
    available = runtime_names(conf_root)
    spelled = name.replace("-", "_") if isinstance(name, str) else None
    if spelled is None or not _RUNTIME_NAME.fullmatch(spelled) or spelled not in available:
        shown = repr(name)[:80]
        raise ConfigError(
            "config.unknown_runtime",
            f"unknown runtime {shown}; a runtime is one of the installed catalog's names: "
            f"{', '.join(available)}",
            "runtime",
        )
    return spelled


def load_runtime_config(conf_root: Path, name: str, overrides: Sequence[str] = ()) -> DictConfig:
    """``<conf_root>/runtime/<name>.yaml`` (``cpu-smoke`` and ``cpu_smoke`` both work) with
    the command line's ``runtime.KEY=VALUE`` / ``+runtime.KEY=VALUE`` overrides applied.
    ``name`` is a catalog name (:func:`catalog_name`), never a path."""
    file = conf_root / "runtime" / f"{catalog_name(conf_root, name)}.yaml"
    config = OmegaConf.load(file)
    if not isinstance(config, DictConfig):
        raise ConfigError("runtime.not_a_mapping", f"{file} must hold a mapping", "runtime")
    apply_overrides(config, overrides)
    return config


def conf_dir() -> Path:
    """The Hydra config tree: the repository's conf/ (editable install) or the wheel's copy."""
    package = Path(__file__).resolve().parent.parent  # xconf/, this module is xconf/runtime/
    for candidate in (package.parent / "conf", package / "_conf"):
        if (candidate / "config.yaml").is_file():
            return candidate
    raise ConfigError("config.no_conf_dir", "cannot find xconf's conf/ tree", str(package))


def runtime_config(name: str, overrides: Sequence[str] = ()) -> DictConfig:
    """``conf/runtime/<name>.yaml`` with the command line's ``runtime.*`` overrides."""
    return load_runtime_config(conf_dir(), name, overrides)


def catalog_runtime(name: Any, options: Mapping[str, Any] | None = None) -> Any:
    """The catalog's runtime ``name`` built with ``options`` (data read from a run directory:
    ``actual.json``'s recorded constructor options) over the catalog's own. The class and the
    sides it pairs are the catalog's, whatever the data says (options naming other sides are
    ``runtime.side_mismatch``); the options are checked like any other."""
    loaded = OmegaConf.to_container(runtime_config(catalog_name(conf_dir(), name)), resolve=True)
    if not isinstance(loaded, dict):
        raise ConfigError("runtime.not_a_mapping", "the runtime config is not a mapping", "runtime")
    config = {str(k): v for k, v in loaded.items()}
    extra = {str(k): v for k, v in (options or {}).items() if k not in NON_OPTION_KEYS}
    check_option_data(extra)
    moved = {
        k: extra[k] for k in PAIRING_OPTIONS if k in config and k in extra and extra[k] != config[k]
    }
    if moved:
        key = next(iter(moved))
        raise ConfigError(
            "runtime.side_mismatch",
            f"the options would pair other sides than the catalog's '{name}' "
            f"({', '.join(f'{k}={config[k]}' for k in moved)}): "
            f"{repr(moved)[:200]}",
            f"runtime.{key}",
        )
    kept = {k: v for k, v in extra.items() if k not in PAIRING_OPTIONS}
    return instantiate_runtime({**config, **kept})


def pairing(config: Mapping[str, Any]) -> dict[str, Any]:
    """The sides a runtime config pairs (and the kind it records), as it names them."""
    return {k: config[k] for k in PAIRING_OPTIONS if k in config}


def apply_overrides(config: DictConfig, overrides: Sequence[str]) -> None:
    """Hydra override grammar, restricted to ``runtime.*``: ``k=v`` changes an existing
    option, ``+k=v`` adds one, ``++k=v`` sets either way."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    for text in overrides:
        try:
            (override,) = OverridesParser.create().parse_overrides([text])
        except (HydraException, ValueError) as exc:  # ValueError: an over-long integer
            message = str(exc).splitlines()[0].split(";")[0]
            raise ConfigError("runtime.bad_override", message, text[:80]) from exc
        key = override.key_or_group
        if not key.startswith("runtime.") or override.is_delete() or override.is_sweep_override():
            raise ConfigError(
                "runtime.bad_override",
                f"'{text}': `xconf run` takes runtime options only, as runtime.KEY=VALUE "
                "or +runtime.KEY=VALUE (experiment settings belong in the experiment file)",
                key,
            )
        option = key.removeprefix("runtime.")
        exists = OmegaConf.select(config, option, default=_ABSENT) is not _ABSENT
        if override.is_add() and exists:
            raise ConfigError(
                "runtime.bad_override", f"'{key}' already exists: drop the '+' to change it", key
            )
        if not exists and not (override.is_add() or override.is_force_add()):
            raise _unknown(str(config.get("_target_", "?")), [option])
        OmegaConf.update(config, option, override.value(), merge=True, force_add=True)


def _unknown(target: str, options: Sequence[str]) -> ConfigError:
    keys = ", ".join(f"runtime.{o}" for o in options)
    return ConfigError(
        "runtime.unknown_option",
        f"the runtime {target} has no option {keys}",
        f"runtime.{options[0]}",
    )


def check_options(factory: Any, target: str, options: Mapping[str, Any]) -> None:
    """Every option must be a parameter of ``factory``, and every required one given."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # a builtin without a signature: nothing to check
        return
    params = signature.parameters.values()
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        names = {p.name for p in params if p.kind is not inspect.Parameter.VAR_POSITIONAL}
        unknown = sorted(k for k in options if k not in names)
        if unknown:
            raise _unknown(target, unknown)
    missing = [
        p.name
        for p in params
        if p.default is inspect.Parameter.empty
        and p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        and p.name not in options
    ]
    if missing:
        raise ConfigError(
            "runtime.missing_option",
            f"the runtime {target} needs option(s) {', '.join('runtime.' + m for m in missing)}",
            f"runtime.{missing[0]}",
        )


def split_target(target: str) -> tuple[str, str]:
    """``"pkg.module:Class"`` or ``"pkg.module.Class"`` as (module, class name)."""
    module, _, name = target.partition(":") if ":" in target else target.rpartition(".")
    return module, name


def _class_chain(module: str, name: str, depth: int = 0) -> Iterator[tuple[ast.ClassDef, str]]:
    """Class ``module:name`` as its source writes it, then its bases imported by name
    (``from m import Base``), depth first, each with its module; nothing when the source
    does not say. No module is imported (``find_spec`` imports only the parent packages)."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin or not spec.origin.endswith(".py") or depth > 8:
        return
    try:
        tree = ast.parse(Path(spec.origin).read_text("utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return
    imported = {
        alias.asname or alias.name: node.module
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0
        for alias in node.names
    }
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            yield node, module
            for base in node.bases:
                if isinstance(base, ast.Name):
                    yield from _class_chain(imported.get(base.id, module), base.id, depth + 1)
            return
        names = [a for a in getattr(node, "names", ()) if (a.asname or a.name) == name]
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and names:
            yield from _class_chain(node.module, names[0].name, depth + 1)  # re-exported
            return


def _class_init(module: str, name: str) -> ast.FunctionDef | None:
    """The ``__init__`` of class ``module:name`` as its source writes it (inherited: the
    first base that says); None when the source does not say."""
    for node, _ in _class_chain(module, name):
        for item in node.body:
            if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                return item
    return None


def class_string(module: str, name: str, attribute: str) -> str | None:
    """A class attribute the source sets to a string literal (inherited too), or None."""
    for node, _ in _class_chain(module, name):
        for item in node.body:
            targets = (
                item.targets
                if isinstance(item, ast.Assign)
                else [item.target]
                if isinstance(item, ast.AnnAssign) and item.value is not None
                else []
            )
            value = getattr(item, "value", None)
            if any(isinstance(t, ast.Name) and t.id == attribute for t in targets):
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    return value.value
                return None
    return None


def plain_with_target(config: Mapping[str, Any] | DictConfig) -> tuple[dict[Any, Any], str]:
    """The runtime config as a plain mapping, and the ``_target_`` it must name."""
    plain = (
        OmegaConf.to_container(config, resolve=True)
        if isinstance(config, DictConfig)
        else dict(config)
    )
    if not isinstance(plain, dict):
        raise ConfigError(
            "runtime.not_a_mapping", "the runtime config must be a mapping", "runtime"
        )
    target = plain.get("_target_")
    if not isinstance(target, str) or not target.strip():
        raise ConfigError("runtime.no_target", "the runtime config names no _target_", "runtime")
    return plain, target


def check_options_unimported(config: Mapping[str, Any] | DictConfig) -> None:
    """``mode=plan``: the runtime's options checked against its constructor as its source
    declares it, without importing the adapter (a plan never imports torch or an engine).

    A constructor the source does not show (built elsewhere, ``**kwargs``) is checked when a
    run instantiates the runtime (:func:`instantiate_runtime`); a ``**unknown`` parameter is
    the adapter's refusal of every other keyword, so the declared ones are all it takes.
    """
    plain, target = plain_with_target(config)
    init = _class_init(*split_target(target))
    # ``**unknown`` is the adapters' spelling of "every other keyword is refused" (they raise
    # runtime.unknown_option for it); any other ``**kwargs`` may take anything.
    if init is None or (init.args.kwarg is not None and init.args.kwarg.arg != "unknown"):
        return
    args = init.args
    names = {a.arg for a in (*args.posonlyargs, *args.args[1:], *args.kwonlyargs)}
    unknown = sorted(str(k) for k in plain if k not in NON_OPTION_KEYS and k not in names)
    if unknown:
        raise _unknown(target, unknown)


def check_option_data(options: Mapping[str, Any], where: str = "runtime") -> None:
    """Options are data: no Hydra key (``_target_`` nested in an option would be built by
    ``instantiate``) and no interpolation (``instantiate`` would resolve it) at any depth."""
    stack: list[tuple[str, Any]] = [(f"{where}.{k}", v) for k, v in options.items()]
    while stack:
        path, value = stack.pop()
        if path.rsplit(".", 1)[-1] in HYDRA_KEYS:
            raise ConfigError(
                "runtime.reserved_key",
                f"{path}: an option may not hold a Hydra key (it would choose code)",
                path,
            )
        if isinstance(value, str) and "${" in value:
            raise ConfigError(
                "runtime.interpolation",
                f"{path}: an option value may not hold an interpolation ({value[:60]!r})",
                path,
            )
        if isinstance(value, Mapping):
            stack.extend((f"{path}.{k}", v) for k, v in value.items())
        elif isinstance(value, list | tuple):
            stack.extend((f"{path}.{i}", v) for i, v in enumerate(value))


def instantiate_runtime(config: Mapping[str, Any] | DictConfig) -> Any:
    """Build the adapter named by ``_target_`` with ``hydra.utils.instantiate``."""
    from hydra.errors import InstantiationException
    from hydra.utils import get_object, instantiate

    plain, target = plain_with_target(config)
    options = {str(k): v for k, v in plain.items() if k not in NON_OPTION_KEYS}
    check_option_data(options)
    try:
        factory = get_object(hydra_target(target))
    except ImportError as exc:
        raise ConfigError(
            "runtime.unknown_target", f"cannot import runtime '{target}': {exc}", "runtime._target_"
        ) from exc
    check_options(factory, target, options)
    try:
        adapter = instantiate({"_target_": hydra_target(target), **options}, _convert_="all")
    except InstantiationException as exc:
        # The adapter's own typed error (bad option value, ...) keeps its code and path.
        if isinstance(exc.__cause__, XconfError):
            raise exc.__cause__ from None
        raise
    # The options it was built with, as given: provenance records them in actual.json so
    # that `xconf localize` rebuilds the run's own adapter (its checkpoint path, ...). A
    # slotted or frozen adapter keeps none: provenance reads its attributes then.
    with contextlib.suppress(AttributeError):
        adapter.constructed_with = dict(options)
    return adapter
