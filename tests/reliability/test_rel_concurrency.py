"""Campaign 3, concurrency: 2-4 runner processes started at once on one experiment and root.

While they run, the tree is polled: a file, once seen under its final name, must keep its
inode and its bytes (plan.jsonl may only grow). Afterwards: no two runners published into
one attempt, every attempt is valid, every case has a valid attempt, and all valid attempts
of a case agree bit for bit. Mechanism: atomic `mkdir` attempt allocation and `flock` on
plan publication (docs/reliability.md).
"""

from __future__ import annotations

import json
import select
import time
from pathlib import Path

import pytest

from tests.reliability.relhelpers import (
    RUN_FLAGS,
    VIEW_FILES,
    ForkServer,
    attempt_state,
    report,
    scaled,
    valid_attempts,
    write_experiment,
)
from xconf.verify import verify_run

EXP = "rel-s0"
# (runners, resume?) per round: --no-resume makes every runner score every case at once.
ROUNDS = [(2, False), (3, True), (4, False)][: scaled(3, 3)]


def _poll(root: Path, seen: dict[str, tuple[int, bytes]], problems: list[str]) -> None:
    for path in list(root.rglob("*")):
        if ".tmp-" in path.name or path.name == ".lock":
            continue
        try:
            if not path.is_file() or path.is_symlink():
                continue
            ino, data = path.lstat().st_ino, path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            problems.append(f"{path}: vanished")
            continue
        rel = str(path.relative_to(root))
        if rel.endswith(VIEW_FILES):
            continue  # a derived view, replaced atomically after each run (docs/artifacts.md)
        if rel not in seen:
            seen[rel] = (ino, data)
            continue
        old_ino, old = seen[rel]
        grew = rel.endswith("plan.jsonl") and data.startswith(old)
        if old_ino != ino or (data != old and not grew):
            problems.append(f"{rel}: overwritten")
        seen[rel] = (ino, data)


def _round(
    server: ForkServer, tmp: Path, experiment: Path, runners: int, resume: bool
) -> dict[str, int]:
    root = tmp / "root"
    go = tmp / "go"
    flags = [] if resume else ["--no-resume"]
    argv = ["run", str(experiment), *RUN_FLAGS, *flags, "--output-root", str(root)]
    summaries = [str(tmp / f"summary{i}.json") for i in range(runners)]
    server.send(op="many", argvs=[argv] * runners, summaries=summaries, go=str(go))
    assert server.receive() == {"started": runners}
    go.touch()  # every runner is forked and waiting: start them at once
    seen: dict[str, tuple[int, bytes]] = {}
    problems: list[str] = []
    done = None
    while done is None:
        _poll(root, seen, problems)
        if select.select([server.replies], [], [], 0.02)[0]:
            done = server.receive()["done"]
    _poll(root, seen, problems)
    assert done == [{"signal": None, "rc": 1}] * runners  # the offset case fails by design
    for summary in summaries:
        assert "Traceback" not in Path(f"{summary}.err").read_text()
    assert problems == []
    published: dict[tuple[str, str], int] = {}
    for i in range(runners):
        for case_id, attempt_id, reused, _ in json.loads(Path(summaries[i]).read_text()):
            if not reused:
                published[(case_id, attempt_id)] = published.get((case_id, attempt_id), 0) + 1
    shared = [k for k, n in published.items() if n > 1]
    assert shared == []  # no two runners published into one attempt
    verdict = verify_run(root / EXP)
    assert verdict.exit_code == 0, [f for f in verdict.findings if f.status != "valid"]
    attempts = valid_attempts(root / EXP)
    on_disk = {(c, p.name) for c, paths in attempts.items() for p in paths}
    assert on_disk == set(published)
    disagreeing = 0
    for paths in attempts.values():
        assert paths
        states = [attempt_state(p) for p in paths]
        disagreeing += any(s != states[0] for s in states[1:])
    assert disagreeing == 0
    return {
        "runners": runners,
        "cases": len(attempts),
        "attempts": len(on_disk),
        "files_watched": len(seen),
        "conflicts": len(shared) + len(problems) + disagreeing,
    }


@pytest.mark.slow
def test_concurrent_runners(tmp_path: Path) -> None:
    started = time.monotonic()
    experiment = write_experiment(tmp_path)
    rounds = []
    server = ForkServer()
    try:
        for index, (runners, resume) in enumerate(ROUNDS):
            work = tmp_path / f"round{index}"
            work.mkdir()
            rounds.append(_round(server, work, experiment, runners, resume))
        server.close()
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
    conflicts = sum(r["conflicts"] for r in rounds)
    assert conflicts == 0
    seconds = time.monotonic() - started
    report(
        "concurrency",
        f"{len(rounds)} rounds of {[r['runners'] for r in rounds]} runners, "
        f"{sum(r['attempts'] for r in rounds)} attempts, "
        f"{sum(r['cases'] for r in rounds)} cases, {conflicts} conflicts, {seconds:.1f}s",
        {"rounds": rounds, "conflicts": conflicts, "seconds": round(seconds, 1)},
    )
