"""Campaign 3, faults: `xconf localize` killed with SIGKILL while it publishes, then run
again. The killed localization is never read back (the report and `latest` skip it, the run
still verifies) and the rerun finishes with a sealed one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.adapters.conftest import model_cache  # noqa: F401  (shared fixture)
from tests.localize.conftest import clean_run  # noqa: F401  (shared fixture)
from tests.reliability.relhelpers import REPO, child_env

# The child localizes with the artifact writer wrapped: SIGKILL just before the Nth file
# (1 localize.json, 2 taps.safetensors, 3 COMPLETE) is published.
CHILD = """
import os, signal, sys
import xconf.artifacts.store as artifact
real = artifact.publish_bytes
calls = []
def killing(*args, **kwargs):
    calls.append(args[1])
    if len(calls) == int(sys.argv[3]):
        os.kill(os.getpid(), signal.SIGKILL)
    return real(*args, **kwargs)
artifact.publish_bytes = killing
from xconf.cli.main import main
sys.exit(main(["localize", sys.argv[1], sys.argv[2]]))
"""


@pytest.mark.slow
@pytest.mark.parametrize("kill_at", [3], ids=["before-COMPLETE"])
def test_localize_killed_while_publishing_then_rerun(
    clean_run: Any,  # noqa: F811
    kill_at: int,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from xconf.artifacts.localization import latest
    from xconf.cli.main import main
    from xconf.report.build import build_report
    from xconf.verify import EXIT_VALID, verify_run

    run = Path(clean_run.experiment_dir)
    case = next(r.case_id for r in clean_run.records if r.label != "baseline")
    before = latest(run, case)
    env = {**child_env(), "XCONF_MODEL_CACHE": os.environ.get("XCONF_MODEL_CACHE", "")}
    killed = subprocess.run(
        [sys.executable, "-c", CHILD, str(run), case, str(kill_at)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode == -9, killed.stderr[-2000:]
    # What the kill left is never read back: the newest sealed localization is unchanged.
    assert latest(run, case) == before
    assert verify_run(run).exit_code == EXIT_VALID
    build_report(run)  # the report still builds
    capsys.readouterr()
    assert main(["localize", str(run), case]) == 0, capsys.readouterr().err
    done = latest(run, case)
    assert done is not None and done != before
    assert done["localize_id"] not in ((before or {}).get("localize_id"),)
    assert verify_run(run).exit_code == EXIT_VALID
