"""Campaign 3, text: control and bidi characters from a runtime, a file or a model are
shown escaped everywhere (terminal, error lines, report.html, token text), and a huge
runtime message is stored bounded, so its sealed attempt stays verifiable.
"""

from __future__ import annotations

import contextlib
import io
import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.reliability.relhelpers import write_experiment
from tests.reliability.relruntimes import RaisingRuntime
from xconf.errors import ConfigError
from xconf.shown_text import bounded, shown

# OSC 52 (clipboard write), a screen clear, an OSC 8 link, a right-to-left override, CSI.
HOSTILE = (
    "device lost \x1b]52;c;cm0gLXJmIH4=\x07 \x1b[2J\x1b[H "
    "\x1b]8;;https://evil.example\x1b\\click\x1b]8;;\x1b\\ "
    "txt.\u202eexe.sh \u2066isolated\u2069 \x9b31m c1 \r overwrite"
)
RAW = ("\x1b", "\x07", "\u202e", "\u2066", "\x9b", "\r")
HUGE = 40 * 1024 * 1024


def _clean(text: str) -> None:
    for char in RAW:
        assert char not in text, repr(char)


def test_shown_escapes_controls_and_bidi_keeps_newlines_and_tabs() -> None:
    out = shown(HOSTILE + "\nnext\tcolumn")
    _clean(out)
    assert "\\x1b]52;c;" in out and "\\u202e" in out and "\\x9b" in out
    assert out.endswith("\nnext\tcolumn") and shown(out) == out  # idempotent
    assert shown("plain [/dev/nvidia0] é 中文 🙂") == "plain [/dev/nvidia0] é 中文 🙂"


class HostileRaisingRuntime(RaisingRuntime):
    """Raises mid-score (rollout.dtype=bfloat16 only) with terminal escapes in its message."""

    def fault(self) -> None:
        raise RuntimeError(HOSTILE)


class HugeRaisingRuntime(RaisingRuntime):
    """Raises mid-score (rollout.dtype=bfloat16 only) with a 40 MB message."""

    def fault(self) -> None:
        raise RuntimeError("head-marker " + "x" * HUGE + " tail-marker")


def _run(root: Path, target: str, timeout: float | None = None) -> Any:
    from xconf.config.strict import load_experiment_file
    from xconf.session import instantiate_runtime, prepare, run_prepared

    spec = load_experiment_file(write_experiment(root.parent / "in"))
    adapter = instantiate_runtime({"_target_": target})
    prepared = prepare(spec, output_root=root, allow_smoke_operators=True, device="cpu")
    return run_prepared(prepared, adapter, resume=True, case_timeout_s=timeout)


def test_hostile_runtime_message_is_escaped_on_the_terminal_and_in_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from xconf.cli.render import make_console, print_reasons, verdict_table
    from xconf.report.build import build_report
    from xconf.report.html import render_html
    from xconf.session import report_error

    root = tmp_path / "root"
    summary = _run(root, "tests.reliability.test_rel_shown_text:HostileRaisingRuntime")
    failed = next(r for r in summary.records if r.result == "error")
    assert HOSTILE in (failed.reason or "")  # stored verbatim: only showing escapes it
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink):
        console = make_console()
        console.print(verdict_table(summary))
        print_reasons(console, summary.records)
    out = sink.getvalue()
    _clean(out)
    assert "\\x1b]52;c;cm0gLXJmIH4=" in out.replace("\n", "")
    report_error(ConfigError("dump.bad_tensor", f"tensor {HOSTILE!s} is not float", HOSTILE))
    _clean(capsys.readouterr().err)
    html = render_html(build_report(root / "rel-s0"))
    _clean(html)
    assert "\\u202e" in html


def test_token_text_is_escaped(tmp_path: Path) -> None:
    from xconf.report.tokens import default_decoder_factory

    vocab = tmp_path / "vocab.json"
    vocab.write_text(json.dumps({"\u202egnp.exe": 0, "\x1b[2J": 1, "plain": 2}))
    decoder = default_decoder_factory(tmp_path, tokenizer=vocab)({})
    assert decoder is not None
    assert [decoder(i) for i in range(3)] == ["\\u202egnp.exe", "\\x1b[2J", "plain"]


def test_bounded_keeps_head_tail_and_length() -> None:
    text = "A" * 10_000 + "B" * 10_000
    out = bounded(text)
    assert out.startswith("A" * 4096) and out.endswith("B" * 2048)
    assert "20000 characters" in out and len(out) < 7000
    assert bounded("short") == "short"


def test_forty_megabyte_runtime_message_seals_a_verifiable_attempt(tmp_path: Path) -> None:
    from xconf.verify import EXIT_VALID, verify_run

    root = tmp_path / "root"
    started = time.monotonic()
    summary = _run(root, "tests.reliability.test_rel_shown_text:HugeRaisingRuntime", timeout=60)
    seconds = time.monotonic() - started
    failed = next(r for r in summary.records if r.result == "error")
    attempt = root / "rel-s0" / "cases" / failed.case_id / failed.attempt_id
    comparison = attempt / "comparison.json"
    assert comparison.stat().st_size < 64 * 1024
    error = json.loads(comparison.read_text())["error"]
    assert error["code"] == "runtime.exception"  # not the time budget
    assert error["message"].startswith("RuntimeError: head-marker")
    full = len("RuntimeError: head-marker ") + HUGE + len(" tail-marker")
    assert f"of {full} characters omitted" in error["message"]
    assert error["message"].endswith(" tail-marker")
    assert max(p.stat().st_size for p in attempt.iterdir()) < 1024 * 1024
    report = verify_run(root / "rel-s0")
    states = {f.attempt_id: f.status for f in report.findings if f.case_id == failed.case_id}
    assert states[failed.attempt_id] == "no_verdict" or report.exit_code != EXIT_VALID
    assert all(f.status != "damaged" for f in report.findings), report.findings
    assert seconds < 60, seconds
