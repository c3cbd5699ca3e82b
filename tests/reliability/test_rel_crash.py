"""Campaign 1, crash consistency: SIGKILL an S0 run at many points, resume, compare bitwise.

A fork server (crash_child.py) imports xconf once; each run is a forked child. A trace of an
uninterrupted run lists every fault point; the campaign kills at points chosen round-robin
over phases (planning, engine construction, scoring, comparison, attempt allocation, each
payload write, sealing), spread over the run. After each kill it resumes to completion;
every third time the resume itself is killed first, at a point of its own run.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path

import pytest

from tests.reliability.relhelpers import (
    ForkServer,
    attempt_state,
    final_state,
    report,
    scaled,
    snapshot,
    unchanged,
    write_experiment,
)
from xconf.artifacts.store import PAYLOAD_FILES, ExperimentStore
from xconf.verify import EXIT_DAMAGED, verify_run

KILLS = scaled(48, 40)
REQUIRED_PHASES = {
    "planning",
    "engine",
    "scoring",
    "seal",
    *(f"write:{name}" for name in PAYLOAD_FILES),
}


def choose_points(trace: list[list[str]], count: int) -> list[int]:
    """Round-robin over (phase, label) groups, each group's points spread evenly."""
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    for index, (label, phase) in enumerate(trace, start=1):
        groups[(phase, label.split(" ")[0].split(":")[0])].append(index)
    # The last instants of a seal: tmp written but not linked, linked but tmp not unlinked.
    critical = ["fsync COMPLETE:after", "link COMPLETE:before", "link COMPLETE:after"]
    chosen = [trace.index([label, "seal"]) + 1 for label in critical]
    queues = []
    for key in sorted(groups, key=lambda k: groups[k][0]):
        points = groups[key]
        # middle first, then the ends, then the rest: different cases and phases per group
        order = [points[len(points) // 2], points[0], points[-1]]
        order += [p for p in points[1::3] if p not in order]
        queues.append(order)
    while len(chosen) < min(count, len(trace)):
        for queue in queues:
            while queue and queue[0] in chosen:
                queue.pop(0)
            if queue and len(chosen) < count:
                chosen.append(queue.pop(0))
    return sorted(chosen)


@pytest.mark.slow
def test_crash_consistency(tmp_path: Path) -> None:
    started = time.monotonic()
    experiment = write_experiment(tmp_path)
    server = ForkServer()
    try:
        reference_root = tmp_path / "reference"
        trace_file = tmp_path / "trace.json"
        traced = server.ask(
            op="trace", file=str(experiment), root=str(reference_root), trace=str(trace_file)
        )
        assert traced["signal"] is None and traced["rc"] == 1  # the offset case fails by design
        trace = json.loads(trace_file.read_text())
        reference = final_state(reference_root / "rel-s0")
        assert len(reference) == 4 or len(reference) == 10

        points = choose_points(trace, KILLS)
        phases_hit: set[str] = set()
        survived = double = 0
        for index, at in enumerate(points):
            root = tmp_path / f"kill-{at:04d}"
            killed = server.ask(op="kill", file=str(experiment), root=str(root), at=at)
            assert killed["signal"] == 9, f"point {at} {trace[at - 1]} was not reached"
            phases_hit.add(trace[at - 1][1])
            exp_dir = root / "rel-s0"
            before = snapshot(root)
            if index % 3 == 0:  # kill the resume too, at a point of its own run
                again = server.ask(
                    op="kill", file=str(experiment), root=str(root), at=5 + (index * 37) % 120
                )
                assert again in ({"signal": 9, "rc": None}, {"signal": None, "rc": 1}), again
                double += again["signal"] == 9
                middle = snapshot(root)
                assert unchanged(before, middle) == [], (at, "second kill")
                before = middle
            store = ExperimentStore(root, "rel-s0")
            valid_before = {
                str(p.relative_to(root))
                for case in store.case_ids()
                for p in store.attempts(case)
                if store.verify_attempt(p).valid
            }
            summary_file = tmp_path / "summary.json"
            resumed = server.ask(
                op="run", file=str(experiment), root=str(root), summary=str(summary_file)
            )
            assert resumed == {"signal": None, "rc": 1}, (at, trace[at - 1], resumed)
            after = snapshot(root)
            assert unchanged(before, after) == [], (at, trace[at - 1])
            for case_id, attempt_id, reused, _ in json.loads(summary_file.read_text()):
                rel = f"rel-s0/cases/{case_id}/{attempt_id}"
                # a reused attempt was sealed and valid before the kill; nothing partial is reused
                assert (rel in valid_before) == reused, (at, rel, reused)
                assert reused or rel not in before, (at, rel)
                assert store.verify_attempt(root / rel).valid
                assert attempt_state(root / rel) == reference[case_id], (at, case_id)
            assert final_state(exp_dir) == reference
            verdict = verify_run(exp_dir)
            assert verdict.exit_code != EXIT_DAMAGED, [f for f in verdict.findings]
            survived += 1
        server.close()
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
    assert survived == len(points) >= 40 and double > 0
    assert phases_hit >= REQUIRED_PHASES, REQUIRED_PHASES - phases_hit
    seconds = time.monotonic() - started
    report(
        "crash",
        f"{survived}/{len(points)} SIGKILLs survived over {len(trace)} fault points "
        f"({double} of them followed by a second kill during the resume), "
        f"phases {sorted(phases_hit)}, {seconds:.1f}s",
        {
            "kills": len(points),
            "survived": survived,
            "double_kills": double,
            "fault_points": len(trace),
            "phases": sorted(phases_hit),
            "seconds": round(seconds, 1),
        },
    )
