"""Strict v1 loading: every bad input gets its own code and names the offending path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.core.bad_inputs import ALL_ERRORS, CONFIG_ERRORS, PLAN_ERRORS, apply
from xconf.config.strict import load_experiment_file, parse_experiment
from xconf.errors import ConfigError, PlanError, XconfError
from xconf.session import prepare


def _issues(error: XconfError) -> list[tuple[str, str | None]]:
    if isinstance(error, PlanError):
        return [(i.code, i.path) for i in error.issues]
    return [(error.code, error.path)]


def _prepare_error(path: Path, out: Path) -> XconfError:
    with pytest.raises(XconfError) as info:
        spec = load_experiment_file(path)
        prepare(spec, output_root=out, allow_smoke_operators=True, device="cpu")
    return info.value


def test_the_shipped_examples_load(s0_doc, s3_doc) -> None:
    assert parse_experiment(s0_doc).experiment_id == "cpu-smoke-json"
    assert parse_experiment(s3_doc).experiment_id == "qwen3-8b-alignment"


@pytest.mark.parametrize(
    ("mutation", "code", "path"),
    [pytest.param(m, c, p, id=i) for i, m, c, p in CONFIG_ERRORS],
)
def test_structural_errors_have_code_and_path(s0_doc, write_doc, mutation, code, path) -> None:
    file = write_doc(apply(s0_doc, mutation))
    with pytest.raises(ConfigError) as info:
        load_experiment_file(file)
    assert info.value.code == code
    if path:
        assert info.value.path == path
        assert path in str(info.value)


@pytest.mark.parametrize(
    ("mutation", "code", "path"),
    [pytest.param(m, c, p, id=i) for i, m, c, p in PLAN_ERRORS],
)
def test_knob_errors_are_plan_issues(s0_doc, write_doc, tmp_path, mutation, code, path) -> None:
    file = write_doc(apply(s0_doc, mutation))
    error = _prepare_error(file, tmp_path / "out")
    assert isinstance(error, PlanError)
    assert (code, path) in _issues(error)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("code_path", [(c, p) for _, _, c, p in ALL_ERRORS])
def test_codes_are_namespaced(code_path) -> None:
    code, _ = code_path
    assert code.split(".", 1)[0] in {"config", "plan", "operator"}


def test_planner_reports_every_issue_at_once(s0_doc) -> None:
    s0_doc["interventions"] = [
        {"path": "rollout.foo", "values": [1]},
        {"path": "rollout.vocab_layout", "values": ["x"]},
        {"path": "batch.size", "values": []},
    ]
    del s0_doc["baseline"]["logp"]
    from xconf.planner import plan_experiment

    with pytest.raises(PlanError) as info:
        plan_experiment(parse_experiment(s0_doc))
    codes = {i.code for i in info.value.issues}
    assert codes == {
        "plan.unsupported_path",
        "plan.derived_knob",
        "plan.empty_intervention",
        "plan.missing_baseline_value",
    }


def test_error_message_lists_the_path() -> None:
    error = ConfigError("config.unknown_key", "unknown key 'foo'", "identity.foo")
    assert "identity.foo" in str(error)
    assert error.to_dict() == {
        "code": "config.unknown_key",
        "path": "identity.foo",
        "message": "unknown key 'foo'",
    }


@pytest.mark.parametrize("key", ["description", "owner", "notes"])
def test_scenario_accepts_descriptive_scalars(s0_doc, key) -> None:
    s0_doc["scenario"][key] = "text"
    assert dict(parse_experiment(s0_doc).scenario.fields)[key] == "text"


def test_threshold_in_an_override_string_value_is_refused(s0_doc) -> None:
    s0_doc["scenario"]["description"] = "training.atol=1e-3"
    with pytest.raises(ConfigError) as info:
        parse_experiment(s0_doc)
    assert info.value.code == "config.threshold_forbidden"
    assert info.value.path == "scenario.description"


# Parses a document from stdin and prints what the run is keyed on: the spec, its identity
# digest and the planned case ids.
_PARSE = """
import json, sys
from xconf.config.strict import parse_experiment
from xconf.planner import plan_experiment
spec = parse_experiment(json.load(sys.stdin))
ids = [case.case_id for case in plan_experiment(spec).cases]
print(json.dumps([repr(spec), spec.identity.digest(), ids]))
"""


def _reordered(value: Any) -> Any:
    """The same document with every mapping's keys in reverse order (lists keep theirs)."""
    if isinstance(value, dict):
        return {k: _reordered(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [_reordered(v) for v in value]
    return value


def test_parsing_is_deterministic(s0_doc) -> None:
    """The same document gives the same spec, identity digest and case ids in another process
    (another hash seed) and with its mappings' keys in another order."""
    outputs = []
    for seed, doc in (("1", s0_doc), ("2", _reordered(s0_doc))):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        proc = subprocess.run(
            [sys.executable, "-c", _PARSE],
            input=json.dumps(doc),
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        outputs.append(json.loads(proc.stdout))
    assert outputs[0] == outputs[1]
    spec = parse_experiment(s0_doc)
    assert outputs[0][0] == repr(spec) and outputs[0][1] == spec.identity.digest()
    assert parse_experiment(_reordered(s0_doc)) == spec
