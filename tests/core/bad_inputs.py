"""Every bad input of the core issue, as (id, mutation, expected code, expected path).

A mutation edits a fresh copy of the S0 v1 document in place, or returns raw JSON text.
Shared by the library-level tests and the CLI tests (which also check exit 2 and that
nothing is written under the output root).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

Mutation = Callable[[dict[str, Any]], str | None]


def _set(path: str, value: Any) -> Mutation:
    """Set a dotted path (list indices as integers) in the document."""

    def mutate(doc: dict[str, Any]) -> None:
        *parents, leaf = path.split(".")
        node: Any = doc
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if isinstance(node, list):
            node[int(leaf)] = value
        else:
            node[leaf] = value

    return mutate


def _delete(path: str) -> Mutation:
    def mutate(doc: dict[str, Any]) -> None:
        *parents, leaf = path.split(".")
        node: Any = doc
        for part in parents:
            node = node[part]
        del node[leaf]

    return mutate


def _interventions(*items: dict[str, Any]) -> Mutation:
    return _set("interventions", list(items))


def _text(transform: Callable[[str], str]) -> Mutation:
    def mutate(doc: dict[str, Any]) -> str:
        return transform(json.dumps(doc, indent=1))

    return mutate


def _duplicate_key(text: str) -> str:
    return text.replace('"strategy":', '"strategy": "pairwise",\n "strategy":', 1)


OPERATORS = {"selected_logprob": {"rollout": "native", "training": {"backend": "native"}}}


def _nested(depth: int) -> Mutation:
    """A scenario field nested ``depth`` lists deep (as raw JSON text)."""

    def transform(text: str) -> str:
        return text.replace(
            '"scenario": {', '"scenario": {"deep": ' + "[" * depth + "]" * depth + ",", 1
        )

    return _text(transform)


def _empty_rows(doc: dict[str, Any]) -> None:
    for field in (
        "token_ids",
        "selected_token_ids",
        "active_mask",
        "attention_mask",
        "position_ids",
    ):
        doc["identity"][field] = [[] for _ in doc["identity"][field]]


def _operator_options(backend: str, options: dict[str, Any]) -> Mutation:
    """An explicit training operator with ``options`` (no logp.backend intervention beside)."""

    def mutate(doc: dict[str, Any]) -> None:
        doc["interventions"] = [i for i in doc["interventions"] if i["path"] != "logp.backend"]
        doc["operators"] = {
            "selected_logprob": {"training": {"backend": backend, "options": options}}
        }

    return mutate


# (id, mutation, code, path)
CONFIG_ERRORS: list[tuple[str, Mutation, str, str]] = [
    # unknown keys at every depth
    ("unknown-top-level", _set("foo", 1), "config.unknown_key", "foo"),
    ("unknown-identity", _set("identity.foo", 1), "config.unknown_key", "identity.foo"),
    (
        "unknown-intervention-key",
        _set("interventions.0.foo", 1),
        "config.unknown_key",
        "interventions[0].foo",
    ),
    (
        "unknown-operators-key",
        _set("operators", {**OPERATORS, "foo": {}}),
        "config.unknown_key",
        "operators.foo",
    ),
    (
        "unknown-operator-side",
        _set("operators", {"selected_logprob": {"rollout": "native", "critic": "native"}}),
        "config.unknown_key",
        "operators.selected_logprob.critic",
    ),
    (
        "unknown-operator-choice-key",
        _set("operators", {"selected_logprob": {"training": {"backend": "native", "x": 1}}}),
        "config.unknown_key",
        "operators.selected_logprob.training.x",
    ),
    ("scenario-nested-value", _set("scenario.foo", {"a": 1}), "config.wrong_type", "scenario.foo"),
    # bad plans that used to reach the engines
    ("nested-3000-deep", _nested(3000), "config.too_deep", ""),
    ("nested-40-deep", _nested(40), "config.too_deep", ""),
    (
        "token-id-1e30",
        _set("identity.token_ids.0.0", 10**30),
        "config.invalid_value",
        "identity.token_ids[0][0]",
    ),
    (
        "token-id-negative",
        _set("identity.selected_token_ids.0.1", -3),
        "config.invalid_value",
        "identity.selected_token_ids[0][1]",
    ),
    (
        "token-id-non-integer",
        _set("identity.token_ids.1.2", 2.5),
        "config.wrong_type",
        "identity.token_ids[1][2]",
    ),
    (  # was planned as token 1
        "token-id-true",
        _set("identity.token_ids.0.0", True),
        "config.wrong_type",
        "identity.token_ids[0][0]",
    ),
    (
        "position-negative",
        _set("identity.position_ids.0.0", -1),
        "config.invalid_value",
        "identity.position_ids[0][0]",
    ),
    ("empty-token-rows", _empty_rows, "config.invalid_value", "identity.token_ids[0]"),
    *[
        (f"no-{field}", _delete(f"identity.{field}"), "config.missing_key", f"identity.{field}")
        for field in ("cache_metadata", "packing_metadata")
    ],
    (
        "operator-option-nested",
        _operator_options("xconf.reference_logp", {"foo": {"bar": 1}}),
        "config.wrong_type",
        "operators.selected_logprob.training.options.foo",
    ),
    # threshold-like keys anywhere
    ("threshold-top", _set("threshold", 0.1), "config.threshold_forbidden", "threshold"),
    (
        "fixed-threshold-top",
        _set("fixed_threshold", 0.1),
        "config.threshold_forbidden",
        "fixed_threshold",
    ),
    (
        "tolerance-scenario",
        _set("scenario.tolerance", 0.1),
        "config.threshold_forbidden",
        "scenario.tolerance",
    ),
    (
        "atol-baseline",
        _set("baseline.rollout.atol", 0.1),
        "config.threshold_forbidden",
        "baseline.rollout.atol",
    ),
    (
        "rtol-identity",
        _set("identity.rtol", 0.1),
        "config.threshold_forbidden",
        "identity.rtol",
    ),
    (
        "threshold-in-intervention",
        _set("interventions.1.threshold", 0.1),
        "config.threshold_forbidden",
        "interventions[1].threshold",
    ),
    (
        "atol-in-operator-options",
        _set(
            "operators",
            {"selected_logprob": {"training": {"backend": "native", "options": {"atol": 1}}}},
        ),
        "config.threshold_forbidden",
        "operators.selected_logprob.training.options.atol",
    ),
    (
        "threshold-uppercase",
        _set("baseline.logp.Threshold", 0.1),
        "config.threshold_forbidden",
        "baseline.logp.Threshold",
    ),
    # execution mode and authorization belong to the command line
    *[
        (f"cli-only-{key}", _set(key, value), "config.cli_only_key", key)
        for key, value in (
            ("execution", "plan"),
            ("plan_only", True),
            ("expected_status", "fail"),
            ("allow_smoke_operators", True),
            ("mode", "plan"),
            ("runtime", "cpu-smoke"),
        )
    ],
    *[
        (
            f"cli-only-scenario-{key}",
            _set(f"scenario.{key}", value),
            "config.cli_only_key",
            f"scenario.{key}",
        )
        for key, value in (
            ("execution", "plan"),
            ("plan_only", True),
            ("expected_status", "pass"),
            ("allow_smoke_operators", True),
        )
    ],
    # unsafe experiment ids
    *[
        (f"unsafe-id-{i}", _set("experiment_id", bad), "config.unsafe_id", "experiment_id")
        for i, bad in enumerate(("a/b", "..", "../escape", "a..b", "/abs", "a\\b", ".hidden"))
    ],
    # strict JSON
    (
        "nan-constant",
        _text(lambda t: t.replace('"size": 2', '"size": NaN', 1)),
        "config.non_finite",
        "",
    ),
    (
        "infinity-constant",
        _text(lambda t: t.replace('"size": 2', '"size": Infinity', 1)),
        "config.non_finite",
        "",
    ),
    (
        "minus-infinity-constant",
        _text(lambda t: t.replace('"size": 2', '"size": -Infinity', 1)),
        "config.non_finite",
        "",
    ),
    ("duplicate-json-key", _text(_duplicate_key), "config.duplicate_key", "strategy"),
    (  # longer than Python converts an integer: was a ValueError traceback
        "int-5000-digits",
        _text(lambda t: t.replace('"size": 2', '"size": ' + "9" * 5000, 1)),
        "config.invalid_json",
        "",
    ),
    (  # a lone surrogate no artifact or terminal can hold: was a UnicodeEncodeError in a run
        "lone-surrogate",
        _text(lambda t: t.replace('"s0-cpu-smoke"', '"s0-\\ud800"', 1)),
        "config.invalid_text",
        "scenario_id",
    ),
    ("invalid-json", _text(lambda t: t[:-3]), "config.invalid_json", ""),
    # structure and types
    ("wrong-schema", _set("schema_version", "v0"), "config.schema_version", "schema_version"),
    ("no-baseline", _delete("baseline"), "config.missing_key", "baseline"),
    ("strategy", _set("strategy", "cartesian"), "config.invalid_value", "strategy"),
    ("strict-not-bool", _set("strict_fallback", "yes"), "config.wrong_type", "strict_fallback"),
    ("interventions-not-list", _set("interventions", {}), "config.wrong_type", "interventions"),
    (
        "values-not-list",
        _set("interventions.0.values", 1),
        "config.wrong_type",
        "interventions[0].values",
    ),
    (
        "token-not-int",
        _set("identity.token_ids.0.0", "x"),
        "config.wrong_type",
        "identity.token_ids[0][0]",
    ),
    (
        "identity-shape",
        _set("identity.active_mask.0", [1, 1]),
        "config.identity_shape",
        "identity.active_mask",
    ),
    (
        "pair-not-pair",
        _set("pairwise_paths", [["batch.size"]]),
        "plan.invalid_pair",
        "pairwise_paths[0]",
    ),
]

# Knob semantics: reported by the planner as PlanIssues.
PLAN_ERRORS: list[tuple[str, Mutation, str, str]] = [
    (
        "unknown-baseline-knob",
        _set("baseline.rollout.foo", 1),
        "plan.unsupported_path",
        "baseline.rollout.foo",
    ),
    (
        "unknown-intervention-knob",
        _interventions({"path": "rollout.quantization", "values": ["fp8"]}),
        "plan.unsupported_path",
        "interventions[0].path",
    ),
    (
        "threshold-as-intervention-path",
        _interventions({"path": "rollout.atol", "values": [0.1]}),
        "plan.threshold_forbidden",
        "interventions[0].path",
    ),
    (
        "derived-intervention",
        _interventions({"path": "rollout.vocab_layout", "values": ["padded"]}),
        "plan.derived_knob",
        "interventions[0].path",
    ),
    (
        "derived-baseline",
        _set("baseline.rollout.world_size", 4),
        "plan.derived_knob",
        "baseline.rollout.world_size",
    ),
    (
        "wrong-type-str-int",
        _set("baseline.batch.size", "8"),
        "plan.wrong_value_type",
        "baseline.batch.size",
    ),
    (
        "wrong-type-bool-str",
        _interventions({"path": "rollout.enforce_eager", "values": ["yes"]}),
        "plan.wrong_value_type",
        "interventions[0].values[0]",
    ),
    (
        "wrong-type-bool-int",
        _interventions({"path": "rollout.enforce_eager", "values": [1]}),
        "plan.wrong_value_type",
        "interventions[0].values[0]",
    ),
    (
        "wrong-type-dtype-int",
        _set("baseline.rollout.dtype", 16),
        "plan.wrong_value_type",
        "baseline.rollout.dtype",
    ),
    (
        "wrong-type-int-bool",
        _interventions({"path": "batch.size", "values": [True]}),
        "plan.wrong_value_type",
        "interventions[0].values[0]",
    ),
    (
        "unsupported-dtype",
        _interventions({"path": "rollout.dtype", "values": ["int8"]}),
        "plan.unsupported_value",
        "interventions[0].values[0]",
    ),
    (
        "non-positive-size",
        _interventions({"path": "batch.size", "values": [0]}),
        "plan.unsupported_value",
        "interventions[0].values[0]",
    ),
    (
        "missing-baseline-knob",
        _delete("baseline.training.sharding"),
        "plan.missing_baseline_value",
        "baseline.training.sharding",
    ),
    (
        "duplicate-intervention",
        _interventions(
            {"path": "batch.size", "values": [1]}, {"path": "batch.size", "values": [4]}
        ),
        "plan.duplicate_intervention",
        "interventions[1].path",
    ),
    (
        "duplicate-value-by-alias",
        _interventions({"path": "rollout.dtype", "values": ["bf16", "bfloat16"]}),
        "plan.duplicate_value",
        "interventions[0].values[1]",
    ),
    (
        "empty-intervention",
        _interventions({"path": "batch.size", "values": []}),
        "plan.empty_intervention",
        "interventions[0].values",
    ),
    (
        "pairwise-without-pairs",
        _set("strategy", "pairwise"),
        "plan.pairwise_paths_required",
        "pairwise_paths",
    ),
    (
        "pairs-without-pairwise",
        _set("pairwise_paths", [["batch.size", "rollout.dtype"]]),
        "plan.pairwise_not_enabled",
        "pairwise_paths",
    ),
    (
        "plan-over-256",
        _interventions({"path": "batch.size", "values": list(range(1, 301))}),
        "plan.too_large",
        "interventions",
    ),
    (
        "logp-intervention-with-mapping",
        _set("operators", OPERATORS),
        "plan.operator_mapping_conflict",
        "interventions.logp.backend",
    ),
    (
        "contract-version",
        _set("contract_version", "1999.1"),
        "plan.contract_version_mismatch",
        "contract_version",
    ),
    (
        "unknown-backend",
        _interventions({"path": "logp.backend", "values": ["acme.fast_logp"]}),
        "operator.unknown_backend",
        "logp.backend",
    ),
]

PLAN_ERRORS += [
    (
        "operator-option-unknown",
        _operator_options("xconf.reference_logp", {"foo": 1}),
        "operator.unknown_option",
        "operators.selected_logprob.training.options.foo",
    ),
    (
        "operator-option-on-native",
        _operator_options("native", {"foo": 1}),
        "operator.unknown_option",
        "operators.selected_logprob.training.options.foo",
    ),
]

ALL_ERRORS = CONFIG_ERRORS + PLAN_ERRORS


def apply(doc: dict[str, Any], mutation: Mutation) -> str:
    """The JSON text of ``doc`` after ``mutation``."""
    text = mutation(doc)
    return text if isinstance(text, str) else json.dumps(doc, indent=1)
