"""From a Hydra-composed config to the strict experiment document, and CLI-only key checks."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from xconf.errors import ConfigError

# Keys of the application itself, defined by conf/config.yaml.
APP_KEYS = frozenset(
    {
        "mode",
        "allow_smoke_operators",
        "output_root",
        "resume",
        "reuse_sides",
        "runtime",
        "case_timeout_s",
        "verbose",
        "localize",
        "fix",
    }
)
KNOB_ROOTS = ("batch", "rollout", "training", "logp")
# Values conf/config.yaml gives them; anything else must come from a command-line override.
CLI_DEFAULTS: dict[str, Any] = {"mode": "run", "allow_smoke_operators": False}
DEFAULT_RUNTIME = "cpu_smoke"


def _override_keys(overrides: list[str]) -> set[str]:
    keys = set()
    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+~")
        keys.add(key)
    return keys


def reject_config_set_cli_keys(
    cfg: DictConfig, overrides: list[str], runtime_choice: str | None
) -> None:
    """Execution mode, runtime and smoke authorization come only from the command line."""
    from_cli = _override_keys(overrides)
    for key, default in CLI_DEFAULTS.items():
        if cfg.get(key) != default and key not in from_cli:
            raise ConfigError(
                "config.cli_only_key",
                f"'{key}' belongs to the command line; a config file or experiment may not set it",
                key,
            )
    if runtime_choice not in (None, DEFAULT_RUNTIME) and "runtime" not in from_cli:
        raise ConfigError(
            "config.cli_only_key",
            "the runtime is chosen on the command line (runtime=NAME), not by an experiment",
            "runtime",
        )
    _reject_config_set_runtime(cfg, from_cli, runtime_choice)
    if cfg.get("mode") not in ("plan", "run"):
        raise ConfigError("config.invalid_value", "mode is plan or run", "mode")
    if not isinstance(cfg.get("allow_smoke_operators"), bool):
        raise ConfigError(
            "config.wrong_type", "allow_smoke_operators is true or false", "allow_smoke_operators"
        )
    check_app_values(cfg)


# Switches that must be real booleans: `resume=no`, `off` or `'false'` are strings, and
# bool() of a non-empty string is True (a "no" would resume).
BOOLEAN_KEYS = ("resume", "reuse_sides", "verbose", "localize", "fix")


def check_app_values(cfg: DictConfig) -> None:
    """The application's own values, typed: refused before anything is written."""
    from xconf.runtime.deadline import check_case_timeout

    for key in BOOLEAN_KEYS:
        value = cfg.get(key, False)
        if not isinstance(value, bool):
            raise ConfigError(
                "config.wrong_type", f"{key} is true or false, got {value!r}"[:200], key
            )
    root = cfg.get("output_root", "outputs")  # conf/config.yaml always sets it
    if not isinstance(root, str) or not root.strip() or "\0" in root:
        raise ConfigError(
            "config.wrong_type",
            f"output_root is a directory path, got {root!r}"[:200],
            "output_root",
        )
    check_case_timeout(cfg.get("case_timeout_s"))


def check_sealed_fields(cfg: DictConfig) -> None:
    """No ``${...}`` in what experiment.json seals: an interpolation puts a value the user
    never wrote there (``${oc.env:HOME}``: the environment), hidden behind a name."""
    raw = OmegaConf.to_container(cfg, resolve=False)
    if not isinstance(raw, dict):
        return
    stack: list[tuple[str, Any]] = [
        (str(k), v) for k, v in raw.items() if k not in APP_KEYS and k != "hydra"
    ]
    while stack:
        path, value = stack.pop()
        if isinstance(value, dict):
            stack.extend((f"{path}.{k}", v) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", v) for i, v in enumerate(value))
        elif isinstance(value, str) and "${" in value:
            raise ConfigError(
                "config.interpolation",
                f"{path} is the interpolation {value[:80]!r}: experiment.json seals the "
                "values as written, so write the value itself",
                path,
            )


def experiment_document(cfg: DictConfig) -> dict[str, Any]:
    """The v1 experiment shape: top-level knob roots become the baseline."""
    check_sealed_fields(cfg)
    container = OmegaConf.to_container(cfg, resolve=True)
    if not isinstance(container, dict):
        raise ConfigError("config.wrong_type", "the composed config is not a mapping", "<root>")
    if "experiment_id" not in container:
        raise ConfigError(
            "config.no_experiment",
            "no experiment selected; run e.g. `xconf-run +experiment=cpu_smoke`",
            "experiment",
        )
    document: dict[str, Any] = {
        str(k): v for k, v in container.items() if k not in APP_KEYS and k not in KNOB_ROOTS
    }
    document["baseline"] = {k: container[k] for k in KNOB_ROOTS if k in container}
    return document


def _reject_config_set_runtime(
    cfg: DictConfig, from_cli: set[str], runtime_choice: str | None
) -> None:
    """The runtime group's file alone defines the runtime: an experiment that sets
    ``runtime._target_`` (or any option) is refused; command-line overrides may set options."""
    if "runtime" not in cfg or "runtime" in from_cli:
        return
    from xconf.runtime.loading import runtime_config

    expected = runtime_config(runtime_choice or DEFAULT_RUNTIME)
    composed = OmegaConf.to_container(cfg.runtime, resolve=True)
    if not isinstance(composed, dict):
        return
    for key in sorted(set(expected) | set(composed), key=lambda k: (k != "_target_", str(k))):
        if composed.get(key) != expected.get(key) and f"runtime.{key}" not in from_cli:
            raise ConfigError(
                "config.cli_only_key",
                f"runtime.{key} is set by a config file or experiment; the runtime and its "
                "options come from conf/runtime/ and the command line only",
                f"runtime.{key}",
            )
