"""Strict loading of an experiment document (the seed's v1 JSON shape) into an ExperimentSpec.

Structure is checked here (unknown keys, forbidden keys, types of containers, identity
shape); knob semantics (allowlist, values, aliases) are checked by the planner, which
reports every problem at once.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from xconf.config.identity import parse_identity
from xconf.errors import ConfigError
from xconf.experiment import (
    EXPERIMENT_SCHEMA_V1,
    EXPERIMENT_SCHEMA_V2,
    ExperimentSpec,
    Intervention,
    OperatorChoice,
    OperatorMapping,
    Scenario,
    is_safe_id,
)
from xconf.knobs import EXTENDED_KNOBS, flatten_knobs

# Where a contract can come from: xconf's own, or the reference project's (its v1 documents
# say "ws1"). The source is sealed into experiment.json, so free text (a URL) is refused.
CONTRACT_SOURCES = ("xconf", "ws1")
THRESHOLD_KEYS = frozenset({"threshold", "fixed_threshold", "tolerance", "atol", "rtol"})
# Execution mode, runtime choice and authorization belong to the command line.
CLI_ONLY_KEYS = frozenset(
    {"execution", "mode", "plan_only", "expected_status", "allow_smoke_operators", "runtime"}
)
TOP_LEVEL_KEYS = frozenset(
    {
        "schema_version",
        "experiment_id",
        "scenario_id",
        "contract_source",
        "contract_version",
        "strategy",
        "strict_fallback",
        "identity",
        "baseline",
        "interventions",
        "pairwise_paths",
        "operators",
        "scenario",
    }
)
SCENARIO_REQUIRED = ("level", "device")
SIDES = ("rollout", "training")


# No experiment needs more: the deepest legitimate node (an operator option, an identity token)
# sits five levels down. Checked iteratively before any recursive walk of the document.
MAX_DEPTH = 32
MAX_EXPERIMENT_BYTES = 64 << 20  # an experiment file larger than this is no experiment


def reject_deep_nesting(node: Any) -> None:
    """Refuse a document nested deeper than :data:`MAX_DEPTH`, naming the path where it is."""
    stack: list[tuple[Any, str, int]] = [(node, "", 0)]
    while stack:
        item, path, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ConfigError(
                "config.too_deep",
                f"the document is nested deeper than {MAX_DEPTH} levels",
                path or "<root>",
            )
        if isinstance(item, Mapping):
            stack.extend((v, f"{path}.{k}" if path else str(k), depth + 1) for k, v in item.items())
        elif isinstance(item, list | tuple):
            stack.extend((v, f"{path}[{i}]", depth + 1) for i, v in enumerate(item))


def reject_threshold_keys(node: Any, path: str = "") -> None:
    """A threshold can only come from the numerical contract: refuse it anywhere."""
    if isinstance(node, Mapping):
        for key, value in node.items():
            child = f"{path}.{key}" if path else str(key)
            if str(key).strip().lower() in THRESHOLD_KEYS:
                raise ConfigError(
                    "config.threshold_forbidden",
                    "thresholds come only from the numerical contract shipped with xconf",
                    child,
                )
            reject_threshold_keys(value, child)
    elif isinstance(node, list | tuple):
        for i, item in enumerate(node):
            reject_threshold_keys(item, f"{path}[{i}]")
    elif isinstance(node, str) and "=" in node:
        # Override strings such as "training.atol=1e-3" hidden inside values.
        key = node.split("=", 1)[0].rsplit(".", 1)[-1].strip().lower().lstrip("+~")
        if key in THRESHOLD_KEYS:
            raise ConfigError(
                "config.threshold_forbidden",
                "thresholds come only from the numerical contract shipped with xconf",
                path,
            )


def _text_problem(text: str) -> str | None:
    """Why ``text`` cannot be written as UTF-8 (a lone surrogate, from a JSON ``\\ud800``
    escape): no artifact, terminal or report could hold it, so it is refused here."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"{text[exc.start : exc.end]!r} at {exc.start} is not a Unicode character"
    return None


def _shown_path(path: str) -> str:
    return path.encode("utf-8", "backslashreplace").decode("utf-8") if path else "<root>"


def reject_non_finite(node: Any, path: str = "") -> None:
    """Numbers that are not finite and text that is not Unicode (keys too), by path."""
    if isinstance(node, float) and not math.isfinite(node):
        raise ConfigError("config.non_finite", f"non-finite number {node!r}", path or "<root>")
    if isinstance(node, str) and (problem := _text_problem(node)) is not None:
        raise ConfigError("config.invalid_text", problem, _shown_path(path))
    if isinstance(node, Mapping):
        for key, value in node.items():
            where = f"{path}.{key}" if path else str(key)
            if isinstance(key, str) and (problem := _text_problem(key)) is not None:
                raise ConfigError("config.invalid_text", f"a key: {problem}", _shown_path(where))
            reject_non_finite(value, where)
    elif isinstance(node, list | tuple):
        for i, item in enumerate(node):
            reject_non_finite(item, f"{path}[{i}]")


def _require_mapping(node: Any, path: str) -> Mapping[str, Any]:
    if not isinstance(node, Mapping):
        raise ConfigError(
            "config.wrong_type", f"expected a mapping, got {type(node).__name__}", path
        )
    for key in node:
        if not isinstance(key, str):
            raise ConfigError("config.wrong_type", f"keys must be strings, got {key!r}", path)
    return node


def check_contract_source(node: Any) -> str:
    source = _require_str(node, "contract_source")
    if source not in CONTRACT_SOURCES:
        raise ConfigError(
            "config.invalid_value",
            f"contract_source must be one of {list(CONTRACT_SOURCES)}, got {source[:80]!r}",
            "contract_source",
        )
    return source


def _require_str(node: Any, path: str) -> str:
    if not isinstance(node, str) or not node.strip():
        raise ConfigError("config.wrong_type", f"expected a non-empty string, got {node!r}", path)
    return node


def _check_keys(node: Mapping[str, Any], allowed: frozenset[str], path: str) -> None:
    for key in node:
        child = f"{path}.{key}" if path else key
        if key in CLI_ONLY_KEYS:
            raise ConfigError(
                "config.cli_only_key",
                f"'{key}' belongs to the command line; a config file may not set it",
                child,
            )
        if key not in allowed:
            raise ConfigError("config.unknown_key", f"unknown key '{key}'", child)


def names_expected_outcome(key: str) -> bool:
    """``expect``, ``expected``, ``expected_*``: an expected outcome, which only the command
    line may state; every other scenario key stays free-form metadata."""
    normal = key.strip().lower().replace("-", "_")
    return normal in ("expect", "expected") or normal.startswith("expected_")


def _parse_scenario(node: Any) -> Scenario:
    scenario = _require_mapping(node, "scenario")
    for key in scenario:
        if key in CLI_ONLY_KEYS or names_expected_outcome(str(key)):
            raise ConfigError(
                "config.cli_only_key",
                f"'{key}' belongs to the command line, not to scenario metadata "
                "(expected outcomes are never read from an experiment)",
                f"scenario.{key}",
            )
    for key in SCENARIO_REQUIRED:
        if key not in scenario:
            raise ConfigError("config.missing_key", f"scenario needs '{key}'", f"scenario.{key}")
    extra = []
    for key in sorted(k for k in scenario if k not in SCENARIO_REQUIRED):
        value = scenario[key]
        if not isinstance(value, str | int | float | bool) and value is not None:
            raise ConfigError(
                "config.wrong_type", "scenario fields are descriptive scalars", f"scenario.{key}"
            )
        extra.append((key, value))
    return Scenario(
        level=_require_str(scenario["level"], "scenario.level"),
        device=_require_str(scenario["device"], "scenario.device"),
        fields=tuple(extra),
    )


def _parse_operator_choice(node: Any, path: str) -> OperatorChoice:
    if isinstance(node, str):
        return OperatorChoice(_require_str(node, path))
    choice = _require_mapping(node, path)
    _check_keys(choice, frozenset({"backend", "options"}), path)
    options = _require_mapping(choice.get("options") or {}, f"{path}.options")
    for key, value in options.items():
        if not isinstance(value, bool | int | float | str):  # hashed and passed as keywords
            raise ConfigError(
                "config.wrong_type",
                f"operator option values are scalars, got {type(value).__name__}",
                f"{path}.options.{key}",
            )
    return OperatorChoice(
        backend=_require_str(choice.get("backend"), f"{path}.backend"),
        options=tuple(sorted(options.items())),
    )


def _parse_operators(node: Any) -> OperatorMapping | None:
    if node is None:
        return None
    operators = _require_mapping(node, "operators")
    _check_keys(operators, frozenset({"selected_logprob"}), "operators")
    if "selected_logprob" not in operators or operators["selected_logprob"] is None:
        return None
    mapping = _require_mapping(operators["selected_logprob"], "operators.selected_logprob")
    _check_keys(mapping, frozenset(SIDES), "operators.selected_logprob")
    sides = {
        side: _parse_operator_choice(mapping[side], f"operators.selected_logprob.{side}")
        for side in SIDES
        if mapping.get(side) is not None
    }
    return OperatorMapping(**sides) if sides else None


def _parse_interventions(node: Any) -> tuple[Intervention, ...]:
    if node is None:
        return ()
    if not isinstance(node, list | tuple):
        raise ConfigError("config.wrong_type", "interventions must be a list", "interventions")
    parsed = []
    for i, item in enumerate(node):
        path = f"interventions[{i}]"
        entry = _require_mapping(item, path)
        _check_keys(entry, frozenset({"path", "values"}), path)
        if "path" not in entry or "values" not in entry:
            raise ConfigError("config.missing_key", "an intervention needs path and values", path)
        values = entry["values"]
        if not isinstance(values, list | tuple):
            raise ConfigError("config.wrong_type", "values must be a list", f"{path}.values")
        parsed.append(Intervention(_require_str(entry["path"], f"{path}.path"), tuple(values)))
    return tuple(parsed)


def _parse_pairs(node: Any) -> tuple[tuple[str, str], ...]:
    if node is None:
        return ()
    if not isinstance(node, list | tuple):
        raise ConfigError("config.wrong_type", "pairwise_paths must be a list", "pairwise_paths")
    pairs = []
    for i, pair in enumerate(node):
        path = f"pairwise_paths[{i}]"
        if not isinstance(pair, list | tuple) or len(pair) != 2:
            raise ConfigError("plan.invalid_pair", "each pair must list exactly two paths", path)
        pairs.append((_require_str(pair[0], f"{path}[0]"), _require_str(pair[1], f"{path}[1]")))
    return tuple(pairs)


def _reject_extended_knobs(
    baseline: Mapping[str, Any],
    interventions: tuple[Intervention, ...],
    pairs: tuple[tuple[str, str], ...],
) -> None:
    """A v1 document names exactly the contract's allowlist; extended knobs need v2."""
    named = [(f"baseline.{path}", path) for path in baseline]
    named += [(f"interventions[{i}].path", item.path) for i, item in enumerate(interventions)]
    named += [
        (f"pairwise_paths[{i}][{j}]", path)
        for i, pair in enumerate(pairs)
        for j, path in enumerate(pair)
    ]
    for where, path in named:
        if path in EXTENDED_KNOBS:
            raise ConfigError(
                "config.extended_knob_in_v1",
                f"'{path}' is an extended knob; a '{EXPERIMENT_SCHEMA_V1}' document takes only "
                f"the contract's allowlist: use schema_version '{EXPERIMENT_SCHEMA_V2}' "
                "(docs/experiment-v2.md) or a Hydra experiment",
                where,
            )


def parse_experiment(document: Any, *, require_schema_version: bool = True) -> ExperimentSpec:
    """Strictly parse an experiment document; raise ConfigError naming the bad path."""
    root = _require_mapping(document, "<root>")
    reject_deep_nesting(root)
    reject_threshold_keys(root)
    reject_non_finite(root)
    _check_keys(root, TOP_LEVEL_KEYS, "")
    # A Hydra-composed experiment has no schema_version and takes the extended knobs (v2).
    version = root.get("schema_version", None if require_schema_version else EXPERIMENT_SCHEMA_V2)
    if version not in (EXPERIMENT_SCHEMA_V1, EXPERIMENT_SCHEMA_V2):
        raise ConfigError(
            "config.schema_version",
            f"expected schema_version '{EXPERIMENT_SCHEMA_V1}' or '{EXPERIMENT_SCHEMA_V2}', "
            f"got {version!r}",
            "schema_version",
        )
    for key in ("experiment_id", "identity", "baseline"):
        if root.get(key) is None:
            raise ConfigError("config.missing_key", f"'{key}' is required", key)
    experiment_id = _require_str(root["experiment_id"], "experiment_id")
    if not is_safe_id(experiment_id):
        raise ConfigError(
            "config.unsafe_id",
            "experiment ids use letters, digits, '.', '_' and '-' (no path separators, no '..')",
            "experiment_id",
        )
    strategy = root.get("strategy", "one_at_a_time")
    if strategy not in ("one_at_a_time", "pairwise"):
        raise ConfigError(
            "config.invalid_value",
            f"unknown strategy {strategy!r}; use one_at_a_time or pairwise",
            "strategy",
        )
    strict = root.get("strict_fallback", True)
    if not isinstance(strict, bool):
        raise ConfigError(
            "config.wrong_type", "strict_fallback must be a boolean", "strict_fallback"
        )
    baseline = _require_mapping(root["baseline"], "baseline")
    interventions = _parse_interventions(root.get("interventions"))
    pairs = _parse_pairs(root.get("pairwise_paths"))
    flat_baseline = flatten_knobs(baseline)
    if version == EXPERIMENT_SCHEMA_V1:
        _reject_extended_knobs(flat_baseline, interventions, pairs)
    return ExperimentSpec(
        experiment_id=experiment_id,
        scenario_id=_require_str(root.get("scenario_id", experiment_id), "scenario_id"),
        contract_source=check_contract_source(root.get("contract_source", "xconf")),
        contract_version=_require_str(root.get("contract_version", "current"), "contract_version"),
        strategy=strategy,
        strict_fallback=strict,
        identity=parse_identity(root["identity"]),
        baseline=tuple(sorted(flat_baseline.items())),  # type: ignore[arg-type]
        interventions=interventions,
        pairwise_paths=pairs,
        operators=_parse_operators(root.get("operators")),
        scenario=_parse_scenario(root.get("scenario", {"level": "S0", "device": "cpu"})),
    )


def load_experiment_file(path: str | Path) -> ExperimentSpec:
    """Load a v1 JSON experiment strictly (duplicate keys and NaN literals are refused)."""
    from xconf.artifacts.layout import read_regular
    from xconf.errors import ArtifactError

    file = Path(path)
    try:  # a regular file, bounded: a FIFO or a device is refused, never waited on
        data = read_regular(file, MAX_EXPERIMENT_BYTES, follow=True)
        if data is None:
            raise FileNotFoundError(f"no such file: {file}")
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError, ArtifactError) as exc:
        message = exc.message if isinstance(exc, ArtifactError) else str(exc)
        raise ConfigError("config.unreadable", f"cannot read {file}: {message}", str(file)) from exc

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for key, value in pairs:
            if key in seen:
                raise ConfigError("config.duplicate_key", f"key '{key}' appears twice", key)
            seen[key] = value
        return seen

    def no_constants(name: str) -> Any:
        raise ConfigError("config.non_finite", f"JSON constant {name} is not allowed", str(file))

    try:
        document = json.loads(text, object_pairs_hook=no_duplicates, parse_constant=no_constants)
    except json.JSONDecodeError as exc:
        raise ConfigError("config.invalid_json", str(exc), str(file)) from exc
    except ValueError as exc:  # an integer longer than Python converts (4,300 digits)
        message = str(exc).split(";")[0]
        raise ConfigError("config.invalid_json", message, str(file)) from exc
    except RecursionError:  # the parser's own stack: far deeper than MAX_DEPTH
        raise ConfigError(
            "config.too_deep", f"the document is nested deeper than {MAX_DEPTH} levels", "<root>"
        ) from None
    return parse_experiment(document)
