"""`xconf-run > log` (what `make run > log` does): a line per finished case as it finishes,
and a line for each long step; on a terminal the progress bar instead."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from tests.commands import REPO
from xconf.case_record import CaseRecord, RunStep
from xconf.cli.render import LONG_STEP_S, case_progress
from xconf.shown_text import console

HELD = "tests.e2e.held_runtime:HeldBuild"
LINE = re.compile(
    r"^\[ ?(\d+)/10\] (c-[0-9a-f]{16})  (\S+)  (pass|fail)  (\d+\.\d) s \((a-\d{4}) (new|reused)\)$"
)


def _case_lines(text: str) -> list[tuple[str, ...]]:
    return [m.groups() for m in map(LINE.match, text.splitlines()) if m]


def test_a_log_shows_each_case_as_it_finishes(tmp_path: Path) -> None:
    hold = tmp_path / "hold"
    hold.write_text("", "utf-8")
    log = tmp_path / "log"
    argv = [
        sys.executable,
        "-m",
        "xconf.cli.hydra_app",
        "+experiment=cpu_smoke",
        "allow_smoke_operators=true",
        f"runtime._target_={HELD}",
        f"+runtime.hold={hold}",
        "+runtime.hold_label='rollout.dtype=bfloat16'",
        f"output_root={tmp_path / 'out'}",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    with log.open("wb") as out:  # stdout is a file: not a terminal
        proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not Path(f"{hold}.started").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        # Held in the bfloat16 case: the cases before it are in the log already.
        so_far = _case_lines(log.read_text("utf-8"))
        assert so_far and so_far[0][2] == "baseline", log.read_text("utf-8")
        assert "rollout.dtype=bfloat16" not in [line[2] for line in so_far]
        time.sleep(1.0)  # the held case takes at least this long
    finally:
        hold.unlink()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err  # cases fail: a finished run
    text = log.read_text("utf-8")
    lines = _case_lines(text)
    assert [int(n) for n, *_ in lines] == list(range(1, 11)), text
    # one line per case, each naming the case, its knob and its verdict as the table does
    table = {
        row.split("│")[1].strip(): row.split("│")[3].strip()
        for row in text.splitlines()
        if row.startswith("│ c-")
    }
    assert {case: result for _, case, _, result, *_ in lines} == table
    assert all(how == "new" for *_, how in lines)
    # a case's time is its own wall time: the held case's includes the hold
    held = next(line for line in lines if line[2] == "rollout.dtype=bfloat16")
    assert float(held[4]) >= 1.0, held
    assert text.index(lines[-1][1]) < text.index("┏")  # every line before the verdict table


def test_a_step_over_ten_seconds_gets_its_line_and_a_short_one_none() -> None:
    out = io.StringIO()
    view = console(file=out, width=200)
    assert not view.is_terminal
    record = CaseRecord(
        "c-0123456789abcdef", "batch.size=1", "case", "a-0001", "pass", False, 4, 0, 0.0, 0.0, None
    )
    with case_progress(view, 2) as progress:
        progress.step(RunStep("identity", "identity frozen", LONG_STEP_S + 20))
        progress.step(RunStep("engine", "rollout engine built for batch.size=1", LONG_STEP_S + 2))
        progress.step(RunStep("engine", "training engine built for batch.size=1", 0.5))
        progress.case(record)
    lines = out.getvalue().splitlines()
    assert lines[0].strip() == f"identity frozen in {LONG_STEP_S + 20:.1f} s"
    assert lines[1].strip() == f"rollout engine built for batch.size=1 in {LONG_STEP_S + 2:.1f} s"
    assert lines[2].startswith("[1/2] c-0123456789abcdef  batch.size=1  pass  ")
    assert len(lines) == 3


def test_a_terminal_gets_the_bar_and_no_lines() -> None:
    out = io.StringIO()
    view = console(file=out, width=120, force_terminal=True)
    record = CaseRecord(
        "c-0123456789abcdef", "baseline", "baseline", "a-0001", "pass", False, 4, 0, 0.0, 0.0, None
    )
    with case_progress(view, 1) as progress:
        progress.step(RunStep("engine", "rollout engine built for baseline", LONG_STEP_S + 2))
        progress.case(record)
    assert "c-0123456789abcdef" not in out.getvalue()  # the bar shows labels, not case lines
