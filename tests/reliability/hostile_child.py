"""Child of the hostile-file campaign: run verify / report / plan on run dirs, measured.

``python -m tests.reliability.hostile_child JOBS`` runs each job in this one process (one
import of torch for all) and prints one JSON line per job: exit code, seconds, the peak
resident memory the command added on top of the imports (the peak is reset through
``/proc/self/clear_refs`` before each job, then ``VmHWM`` after it minus ``VmRSS`` before
it; ``resource.getrusage``'s ``ru_maxrss`` is reported too) and whether anything (a
traceback, a RecursionError) escaped.
"""

from __future__ import annotations

import contextlib
import io
import json
import resource
import sys
import time
import traceback
from pathlib import Path
from typing import Any


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _run(cli_main: Any, command: str, run_dir: Path, experiment: str) -> dict[str, Any]:
    if command == "resume":  # what `xconf run` reads before scoring: plan, every attempt
        return _measure(lambda: _resume_scan(run_dir))
    if command == "verify":
        args = ["verify", str(run_dir)]
    elif command == "report":
        args = ["report", str(run_dir), "--format", "json", "-o", str(run_dir.parent / "r.json")]
    else:  # plan: reads experiment.json and plan.jsonl of the output root before writing
        args = ["plan", experiment, "--output-root", str(run_dir.parent)]
    return _measure(lambda: cli_main(args))


def _resume_scan(run_dir: Path) -> int:
    from xconf.artifacts.store import ExperimentStore
    from xconf.errors import XconfError

    store = ExperimentStore(run_dir.parent, run_dir.name)
    try:
        store.planned_case_ids()
    except XconfError:  # coded, as `xconf run` reports it (exit 2)
        return 2
    valid = [store.verify_attempt(p).valid for c in store.case_ids() for p in store.attempts(c)]
    return 0 if all(valid) else 1


def _measure(command: Any) -> dict[str, Any]:
    with contextlib.suppress(OSError):  # reset VmHWM to the current RSS (Linux >= 4.0)
        Path("/proc/self/clear_refs").write_text("5")
    before = _status_kib("VmRSS")
    sink = io.StringIO()
    escaped = None
    started = time.monotonic()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        try:
            code = command()
        except SystemExit as exc:
            code = int(exc.code or 0)
        except BaseException as exc:  # what the campaign looks for: nothing may escape
            escaped = f"{type(exc).__name__}: {exc}"
            traceback.print_exc()
            code = 99
    seconds = time.monotonic() - started
    return {
        "code": code,
        "seconds": round(seconds, 3),
        "added_mib": round(max(0, _status_kib("VmHWM") - before) / 1024, 1),
        "maxrss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "escaped": escaped,
        "output": sink.getvalue()[-3000:],
    }


def main(argv: list[str]) -> int:
    """argv: a JSON list of [name, command, run_dir, experiment] jobs; one JSON line each."""
    import xconf.cli.main  # the imports, torch included, are not a command's cost
    import xconf.report.cli
    import xconf.verify

    for name, command, run_dir, experiment in json.loads(argv[0]):
        result = _run(xconf.cli.main.main, command, Path(run_dir), experiment)
        print(json.dumps({"name": name, "command": command, **result}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
