"""Campaign 8, odd text and odd ids: printed verbatim, matched in full.

A runtime message with ``[/dev/nvidia0]`` in it must neither raise rich's MarkupError nor
lose its brackets; an id with a trailing newline is refused; an output path component over
the file-system limit is a coded ``artifacts.io`` (exit 2); scenario keys naming an
expected outcome are refused while other scenario keys stay free-form metadata.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

import pytest

from tests.reliability.relhelpers import cli_output, s0_document, write_experiment
from tests.reliability.relruntimes import RaisingRuntime
from xconf.config.strict import parse_experiment
from xconf.errors import ConfigError
from xconf.experiment import is_safe_id

MESSAGE = "CUDA error at [/dev/nvidia0]: device lost [bold]not markup[/bold] [link=x]"


def test_runtime_messages_print_verbatim() -> None:
    from xconf.case_record import CaseRecord, RunSummary
    from xconf.cli.render import make_console, print_reasons, verdict_table

    record = CaseRecord(
        case_id="c-0123456789abcdef",
        label="rollout.dtype=[/dev/nvidia0]",
        kind="one_at_a_time",
        attempt_id="a-0001",
        result="error",
        reused=False,
        active_tokens=0,
        mismatches=0,
        max_abs_diff=None,
        p99_abs_diff=None,
        reason=MESSAGE,
    )
    summary = RunSummary("exp", "/tmp/[b]exp", [record])
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink):
        console = make_console()
        console.print(verdict_table(summary))
        print_reasons(console, [record])
    out = sink.getvalue()
    assert MESSAGE in out
    assert "rollout.dtype=[/dev/nvidia0]" in out


@pytest.mark.parametrize("bad", ["rel-s0\n", "rel-s0\r\n", "rel\n-s0"])
def test_ids_are_matched_in_full(bad: str) -> None:
    assert not is_safe_id(bad)
    document = s0_document()
    document["experiment_id"] = bad
    with pytest.raises(ConfigError) as info:
        parse_experiment(document)
    assert info.value.path == "experiment_id"


def test_over_long_output_path_component_is_a_coded_error(tmp_path: Path) -> None:
    experiment = write_experiment(tmp_path)
    code, out = cli_output("plan", experiment, "--output-root", tmp_path / ("x" * 300))
    assert code == 2, out
    assert "artifacts.io" in out and "Traceback" not in out


@pytest.mark.parametrize("key", ["expected_outcome", "expected_result", "expect", "Expected"])
def test_scenario_keys_naming_an_expected_outcome_are_refused(key: str) -> None:
    document: dict[str, Any] = s0_document()
    document["scenario"] = {"level": "S0", "device": "cpu", key: "pass"}
    with pytest.raises(ConfigError) as info:
        parse_experiment(document)
    assert info.value.code == "config.cli_only_key"
    assert info.value.path == f"scenario.{key}"


def test_other_scenario_keys_stay_free_form_metadata() -> None:
    document: dict[str, Any] = s0_document()
    metadata = {"model_id": "Qwen/Qwen3-0.6B", "notes": "from verl", "rollout_engine": "vllm"}
    document["scenario"] = {"level": "S0", "device": "cpu", **metadata}
    spec = parse_experiment(document)
    assert dict(spec.scenario.fields) == metadata


class MarkupRaisingRuntime(RaisingRuntime):
    """Raises mid-score (rollout.dtype=bfloat16 only) with brackets in its message."""

    def fault(self) -> None:
        raise RuntimeError(MESSAGE)


@pytest.mark.slow
def test_hydra_run_with_bracketed_runtime_error_and_expected_scenario_key(
    tmp_path: Path,
) -> None:
    """End to end: the error case is sealed, its message printed verbatim, report.html
    written; ``+scenario.expected_outcome=pass`` is refused before anything is written."""
    from hydra import compose, initialize_config_dir

    from xconf.cli.hydra_app import run_from_config
    from xconf.runtime.loading import conf_dir

    root = tmp_path / "hydra"
    overrides = [
        "+experiment=cpu_smoke",
        "allow_smoke_operators=true",
        "runtime._target_=tests.reliability.test_rel_text:MarkupRaisingRuntime",
        f"output_root={root}",
    ]
    sink = io.StringIO()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        refused = [*overrides, "+scenario.expected_outcome=pass"]
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            assert run_from_config(compose("config", overrides=refused), refused, "cpu_smoke") == 2
        assert "config.cli_only_key" in sink.getvalue() and not root.exists()
        sink = io.StringIO()
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            code = run_from_config(compose("config", overrides=overrides), overrides, "cpu_smoke")
    out = sink.getvalue()
    assert code == 1, out
    assert MESSAGE in out.replace("\n", " ") or "[/dev/nvidia0]" in out, out
    assert "MarkupError" not in out and "Traceback" not in out
    reports = list(root.rglob("report.html"))
    assert len(reports) == 1 and reports[0].stat().st_size > 0
