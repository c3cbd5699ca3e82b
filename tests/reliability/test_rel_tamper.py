"""Campaign 2, tamper matrix: damage one file of a sealed attempt in every way, resume, verify.

For every payload and COMPLETE: flip a byte, truncate, empty, delete, replace by a symlink
(to a byte-identical copy outside the attempt), replace by a directory; and add unexpected
entries to the attempt. Resume must never reuse or modify the damaged attempt and must
publish a fresh valid attempt equal bit for bit to the original; `xconf verify` must report
the damaged attempt with a reason and exit non-zero.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load as load_tensors
from safetensors.torch import save_file

from tests.reliability.relhelpers import (
    RUN_FLAGS,
    attempt_state,
    cli,
    report,
    scaled,
    snapshot,
    unchanged,
)
from xconf.artifacts.store import PAYLOAD_FILES, SEAL_NAME, read_tensors
from xconf.verify import EXIT_DAMAGED, EXIT_VALID, verify_run

EXP = "rel-s0"


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _empty(path: Path) -> None:
    path.write_bytes(b"")


def _symlink(path: Path) -> None:
    twin = path.parent.parent / f"twin-of-{path.parent.name}-{path.name}"
    shutil.copyfile(path, twin)  # identical bytes: only the link itself is wrong
    path.unlink()
    path.symlink_to(twin)


def _directory(path: Path) -> None:
    path.unlink()
    path.mkdir()


MUTATIONS: dict[str, Callable[[Path], None]] = {
    "flip": _flip,
    "truncate": _truncate,
    "empty": _empty,
    "delete": lambda p: p.unlink(),
    "symlink": _symlink,
    "directory": _directory,
}
EXTRA_ENTRIES = ("notes.txt", ".hidden", "score_rollout.pt", "COMPLETE.bak", "subdir/")
TARGETS = (*PAYLOAD_FILES, SEAL_NAME)


def _tampers() -> list[tuple[str, str]]:
    return [(t, m) for t in TARGETS for m in MUTATIONS] + [("+extra", e) for e in EXTRA_ENTRIES]


def _apply(attempt: Path, target: str, how: str) -> None:
    if target == "+extra":
        if how.endswith("/"):
            (attempt / how.rstrip("/")).mkdir()
        else:
            (attempt / how).write_bytes(b"not part of the attempt\n")
        return
    MUTATIONS[how](attempt / target)


def _sources(attempt: Path) -> set[str]:
    """The cases whose attempt ``attempt`` took a side's scores from (actual.json)."""
    actual = json.loads((attempt / "actual.json").read_text())
    return {r["case_id"] for r in actual.get("reused_sides", {}).values()}


@pytest.mark.slow
def test_tamper_matrix(pristine: tuple[Path, Path], tmp_path: Path) -> None:
    started = time.monotonic()
    experiment, source = pristine
    cases = sorted(p.name for p in (source / EXP / "cases").iterdir())
    originals = {c: attempt_state(source / EXP / "cases" / c / "a-0001") for c in cases}
    tried = detected = 0
    reasons: dict[str, str] = {}
    for index, (target, how) in enumerate(_tampers()):
        root = tmp_path / f"t{index:03d}"
        shutil.copytree(source, root, symlinks=True)
        case = cases[index % len(cases)]
        attempt = root / EXP / "cases" / case / "a-0001"
        _apply(attempt, target, how)
        tried += 1
        # verify sees the damage before anything else happens
        report_before = verify_run(root / EXP)
        finding = next(
            f for f in report_before.findings if f.attempt_id == "a-0001" and f.case_id == case
        )
        assert finding.status in ("damaged", "partial") and finding.reason, (target, how)
        assert report_before.exit_code != EXIT_VALID
        assert cli("verify", root / EXP) == report_before.exit_code
        before = snapshot(root)
        assert cli("run", experiment, *RUN_FLAGS, "--output-root", root) == 1
        after = snapshot(root)
        assert unchanged(before, after) == [], (target, how)
        fresh = attempt.parent / "a-0002"
        assert (fresh / SEAL_NAME).is_file(), (target, how)
        assert attempt_state(fresh) == originals[case], (target, how)
        # nothing else was rescored but the cases that took a side's scores from the
        # tampered attempt (their reuse can no longer be re-derived: scored again)
        for other in cases:
            if other != case and case not in _sources(root / EXP / "cases" / other / "a-0001"):
                assert not (root / EXP / "cases" / other / "a-0002").exists()
        report_after = verify_run(root / EXP)
        statuses = {(f.case_id, f.attempt_id): f.status for f in report_after.findings}
        assert statuses[(case, "a-0002")] == "valid"
        # rescored: the damaged attempt is history (superseded/abandoned), the case is valid
        assert statuses[(case, "a-0001")] in ("superseded", "abandoned")
        # (the symlink mutation leaves its twin file in the case dir: that entry is damage)
        expected = EXIT_DAMAGED if how == "symlink" else EXIT_VALID
        assert report_after.exit_code == expected, report_after.findings
        detected += 1
        reasons[f"{target}:{how}"] = finding.reason or ""
        shutil.rmtree(root)
    assert detected == tried == len(TARGETS) * len(MUTATIONS) + len(EXTRA_ENTRIES)
    # a deleted COMPLETE is indistinguishable from a crash before sealing: reported partial
    assert reasons[f"{SEAL_NAME}:delete"].startswith("no COMPLETE seal")
    seconds = time.monotonic() - started
    report(
        "tamper",
        f"{detected}/{tried} tampered attempts detected, never reused, never modified, "
        f"re-scored bit-identically, {seconds:.1f}s",
        {"tried": tried, "detected": detected, "seconds": round(seconds, 1), "reasons": reasons},
    )


def test_verify_cli_exit_codes(pristine: tuple[Path, Path], tmp_path: Path) -> None:
    """`xconf verify`: 0 valid, 1 damaged (checked in a real process), 2 bad dir, 3 incomplete."""
    import subprocess
    import sys

    from tests.reliability.relhelpers import REPO, child_env

    _, source = pristine
    root = tmp_path / "v"
    shutil.copytree(source, root, symlinks=True)
    cases = sorted((root / EXP / "cases").iterdir())
    os.mkdir(cases[0] / "a-0007")  # a partial attempt
    damaged = root / "damaged"
    shutil.copytree(root, damaged, symlinks=True)
    _flip(sorted((damaged / EXP / "cases").iterdir())[1] / "a-0001" / "token_diffs.safetensors")
    assert [cli("verify", d) for d in (source / EXP, root / EXP, root)] == [0, 3, 2]
    results = []
    for run_dir in (damaged / EXP,):
        done = subprocess.run(
            [sys.executable, "-m", "xconf.cli.main", "verify", str(run_dir)],
            env=child_env(),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        results.append(done.returncode)
        assert "Traceback" not in done.stderr + done.stdout
    assert results == [1]


def _reseal(attempt: Path, result: str | None = None) -> None:
    """Recompute every digest in COMPLETE: a forgery that the seal alone cannot catch."""
    seal = json.loads((attempt / SEAL_NAME).read_text())
    for name in seal["files"]:
        seal["files"][name] = hashlib.sha256((attempt / name).read_bytes()).hexdigest()
    if result is not None:
        seal["result"] = result
    (attempt / SEAL_NAME).write_text(json.dumps(seal))


def _edit_tensors(path: Path, key: str, change: Callable[[torch.Tensor], torch.Tensor]) -> None:
    tensors = read_tensors(path)
    tensors[key] = change(tensors[key]).contiguous()
    path.unlink()
    save_file(tensors, str(path))


def _edit_json(path: Path, **changes: Any) -> None:
    doc = json.loads(path.read_text())
    doc.update(changes)
    path.unlink()
    path.write_text(json.dumps(doc))


def _flip_verdict(attempt: Path) -> str:
    _edit_json(attempt / "comparison.json", result="fail")
    return "fail"


def _bump(t: torch.Tensor) -> torch.Tensor:
    t = t.clone()
    t[0, 7] += 1.0  # an active token (positions 5-14 are active in the S0 identity)
    return t


FORGERIES: dict[str, Callable[[Path], str | None]] = {
    "verdict flipped": _flip_verdict,
    "mismatch count": lambda a: _edit_json(a / "comparison.json", mismatches=3),
    "threshold widened": lambda a: _edit_tensors(
        a / "token_diffs.safetensors", "threshold", lambda t: t * 0 + 1.0
    ),
    "rollout logprob moved": lambda a: _edit_tensors(
        a / "token_diffs.safetensors", "rollout_logprobs", _bump
    ),
    "training score moved": lambda a: _edit_tensors(
        a / "score_training.safetensors", "logprobs", _bump
    ),
    "mismatch mask edited": lambda a: _edit_tensors(
        a / "token_diffs.safetensors", "mismatch_mask", lambda t: 1 - t
    ),
}


def test_resealed_forgeries_are_caught_by_verify(
    pristine: tuple[Path, Path], tmp_path: Path
) -> None:
    """Seals are integrity, not authentication: a re-sealed forgery passes the seal check,
    so `xconf verify` re-judges every verdict from the stored tensors and threshold."""
    _, source = pristine
    caught = {}
    for index, (name, forge) in enumerate(FORGERIES.items()):
        root = tmp_path / f"f{index}"
        shutil.copytree(source, root, symlinks=True)
        baseline = next(
            c
            for c in sorted((root / EXP / "cases").iterdir())
            if json.loads((c / "a-0001" / "comparison.json").read_text())["result"] == "pass"
        )
        attempt = baseline / "a-0001"
        _reseal(attempt, forge(attempt))
        findings = verify_run(root / EXP).findings
        finding = next(f for f in findings if f.case_id == baseline.name)
        assert finding.status == "damaged", (name, finding)
        caught[name] = finding.reason
    assert len(caught) == len(FORGERIES)
    report(
        "forgeries",
        f"{len(caught)}/{len(FORGERIES)} re-sealed forgeries caught by verdict recomputation",
        {"caught": caught},
    )


def _parses(name: str, blob: bytes) -> bool:
    """Whether ``blob`` still parses as payload ``name`` (JSON as UTF-8, else safetensors)."""
    try:
        if name.endswith(".json"):
            json.loads(blob.decode("utf-8"))
        else:
            load_tensors(blob)
    except Exception:  # any parser error: the payload is unreadable
        return False
    return True


@pytest.mark.slow
def test_verify_never_crashes_on_resealed_garbage(
    pristine: tuple[Path, Path], tmp_path: Path
) -> None:
    """Random edits to any payload, re-sealed so they pass the digest check: verify reports,
    never raises (the seal no longer shields the parsers of comparison.json and tensors).
    An edit that leaves the bytes as they were is valid; one that leaves a payload that no
    longer parses is damaged, with a reason; and the fuzz really damages attempts."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    _, source = pristine
    counter = iter(range(10**6))
    seen = {"damaged": 0, "valid": 0, "unchanged": 0, "unparseable": 0}

    @settings(
        max_examples=scaled(60, 60),
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(
        st.sampled_from(PAYLOAD_FILES),
        st.integers(min_value=0),
        st.binary(min_size=0, max_size=16),
        st.sampled_from(["replace", "insert", "truncate"]),
    )
    def fuzz(name: str, where: int, data: bytes, how: str) -> None:
        root = tmp_path / f"g{next(counter)}"
        shutil.copytree(source / EXP, root / EXP, symlinks=True)
        attempt = sorted((root / EXP / "cases").iterdir())[0] / "a-0001"
        original = blob = (attempt / name).read_bytes()
        at = where % (len(blob) + 1)
        if how == "replace":
            blob = blob[:at] + data + blob[at + len(data) :]
        elif how == "insert":
            blob = blob[:at] + data + blob[at:]
        else:
            blob = blob[:at]
        (attempt / name).unlink()
        (attempt / name).write_bytes(blob)
        _reseal(attempt)
        finding = next(f for f in verify_run(root / EXP).findings if f.attempt_id == "a-0001")
        assert finding.status in ("damaged", "valid"), finding
        seen["damaged" if finding.status == "damaged" else "valid"] += 1
        if blob == original:
            seen["unchanged"] += 1
            assert finding.status == "valid", (name, how, finding)
        elif not _parses(name, blob):
            seen["unparseable"] += 1
            assert finding.status == "damaged" and finding.reason, (name, how, finding)
        shutil.rmtree(root)

    fuzz()
    assert seen["damaged"] > 0 and seen["unparseable"] > 0, seen  # the edits really bit
    edits = seen["damaged"] + seen["valid"]
    report("verify_fuzz", f"verify survived {edits} re-sealed garbage edits", seen)
