"""The plain CLI on bad input: exit 2, the specific code and path on stderr, nothing written."""

from __future__ import annotations

import pytest

from tests.conftest import S0_JSON, S3_JSON, snapshot
from tests.core.bad_inputs import ALL_ERRORS, apply

COMMANDS = {
    "plan": ("plan",),
    "run": ("run", "--runtime", "cpu-smoke", "--allow-smoke-operators"),
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize(
    ("mutation", "code", "path"), [pytest.param(m, c, p, id=i) for i, m, c, p in ALL_ERRORS]
)
def test_bad_input_exits_2_and_writes_nothing(
    xconf_cli, s0_doc, write_doc, tmp_path, command, mutation, code, path
) -> None:
    file = write_doc(apply(s0_doc, mutation))
    out = tmp_path / "out"
    verb, *flags = COMMANDS[command]
    rc, _, stderr = xconf_cli(verb, file, *flags, "--output-root", out)
    assert rc == 2
    assert f"[{code}]" in stderr
    if path:
        assert f"'{path}'" in stderr
    assert not out.exists()


def test_smoke_operator_without_authorization_is_refused(xconf_cli, tmp_path) -> None:
    out = tmp_path / "out"
    rc, _, stderr = xconf_cli("run", S0_JSON, "--runtime", "cpu-smoke", "--output-root", out)
    assert rc == 2
    assert "[operator." in stderr
    assert "smoke_only.logp_reference" in stderr and "smoke_only.logp_offset" in stderr
    assert "'logp.backend'" in stderr
    assert not out.exists()


def test_plan_only_scenario_cannot_run_on_the_cpu_runtime(xconf_cli, tmp_path) -> None:
    out = tmp_path / "out"
    rc, _, stderr = xconf_cli("run", S3_JSON, "--runtime", "cpu-smoke", "--output-root", out)
    assert rc == 2
    assert "[runtime.device_mismatch]" in stderr
    assert not out.exists()


def test_unknown_runtime(xconf_cli, tmp_path) -> None:
    out = tmp_path / "out"
    rc, _, stderr = xconf_cli("run", S0_JSON, "--runtime", "tpu-magic", "--output-root", out)
    assert rc == 2
    assert "[config.unknown_runtime]" in stderr
    assert not out.exists()


@pytest.mark.parametrize("override", ["+runtime.model_path=x", "runtime.model_path=x"])
def test_unknown_runtime_option_is_a_coded_error(xconf_cli, tmp_path, override) -> None:
    out = tmp_path / "out"
    rc, _, stderr = xconf_cli(
        "run", S0_JSON, "--runtime", "cpu-smoke", override, "--output-root", out
    )
    assert rc == 2, stderr
    assert "[runtime.unknown_option] at 'runtime.model_path'" in stderr
    assert "Traceback" not in stderr
    assert not out.exists()


def test_runtime_overrides_reach_the_adapter_and_nothing_else(xconf_cli, tmp_path) -> None:
    out = tmp_path / "out"
    rc, _, stderr = xconf_cli(
        "run", S0_JSON, "--runtime", "cpu-smoke", "batch.size=3", "--output-root", out
    )
    assert rc == 2 and "[runtime.bad_override] at 'batch.size'" in stderr
    assert not out.exists()


@pytest.mark.parametrize("flag", ["--threshold", "--atol", "--tolerance", "--plan-only"])
def test_the_cli_has_no_threshold_or_mode_flag(xconf_cli, tmp_path, flag) -> None:
    out = tmp_path / "out"
    rc, _, stderr = xconf_cli(
        "run", S0_JSON, "--runtime", "cpu-smoke", flag, "0.1", "--output-root", out
    )
    assert rc == 2
    assert "unrecognized arguments" in stderr
    assert not out.exists()


def test_missing_file(xconf_cli, tmp_path) -> None:
    rc, _, stderr = xconf_cli("plan", tmp_path / "nope.json", "--output-root", tmp_path / "o")
    assert rc == 2 and "[config.unreadable]" in stderr
    assert not (tmp_path / "o").exists()


def test_bad_input_leaves_an_existing_output_root_untouched(
    xconf_cli, s0_doc, write_doc, tmp_path
) -> None:
    out = tmp_path / "out"
    assert xconf_cli("plan", S0_JSON, "--output-root", out)[0] == 0
    before = snapshot(out)
    assert before
    s0_doc["interventions"].append({"path": "batch.size", "values": [8]})
    rc, _, stderr = xconf_cli("plan", write_doc(s0_doc), "--output-root", out)
    assert rc == 2 and "[plan.duplicate_intervention]" in stderr
    assert snapshot(out) == before
