"""One runner of the concurrency campaign: import, say ready, wait for the start signal, run.

Usage: concurrent_child.py READY GO SUMMARY -- xconf CLI arguments...
The summary lists [case_id, attempt_id, reused, result] for every case this runner handled.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

import xconf.cli.main as cli_main


def main() -> int:
    ready, go, summary = (Path(a) for a in sys.argv[1:4])
    argv = sys.argv[5:]
    torch.set_num_threads(1)
    real = cli_main.run_prepared

    def run_prepared(*args: Any, **kwargs: Any) -> Any:
        result = real(*args, **kwargs)
        rows = [[r.case_id, r.attempt_id, r.reused, r.result] for r in result.records]
        summary.write_text(json.dumps(rows), "utf-8")
        return result

    cli_main.run_prepared = run_prepared  # type: ignore[assignment]
    ready.touch()
    deadline = time.monotonic() + 120
    while not go.exists():
        if time.monotonic() > deadline:
            return 98
        time.sleep(0.005)
    return cli_main.main(argv)


if __name__ == "__main__":
    sys.exit(main())
