"""The one seal check of an attempt directory: store (resume), verify and report call it.

An attempt is exactly one of three typed states:

* :class:`Sealed`: ``COMPLETE`` parses, names this attempt, seals exactly the payload files,
  which are present, regular and match their digests, and its result agrees with
  ``comparison.json``;
* :class:`Partial`: a real directory with no ``COMPLETE`` at all, what an interrupted run
  leaves (never damage by itself);
* :class:`Damaged`: anything else, with every problem found (the first is the headline).

Torch-free; every file goes through the bounded regular-file readers of ``layout``.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xconf.artifacts.layout import (
    COMPARISON_NAME,
    PAYLOAD_FILES,
    SEAL_KEYS,
    SEAL_NAME,
    SEAL_SCHEMA,
    attempt_number,
    parse_json,
    read_json,
    read_regular,
    sha256_file,
)
from xconf.errors import ArtifactError

PARTIAL_REASON = "no COMPLETE seal (partial attempt)"


@dataclass(frozen=True)
class Sealed:
    seal: Mapping[str, Any]

    @property
    def problems(self) -> tuple[str, ...]:
        return ()


@dataclass(frozen=True)
class Partial:
    """An attempt that was never sealed: what a run interrupted before sealing leaves."""

    @property
    def problems(self) -> tuple[str, ...]:
        return (PARTIAL_REASON,)


@dataclass(frozen=True)
class Damaged:
    problems: tuple[str, ...]
    seal: Mapping[str, Any] | None = None


AttemptState = Sealed | Partial | Damaged


def _str_field(seal: Mapping[str, Any] | None, key: str) -> str | None:
    value = (seal or {}).get(key)
    return value if isinstance(value, str) else None


def execution_key(state: AttemptState) -> str | None:
    return _str_field(state.seal if not isinstance(state, Partial) else None, "execution_key")


def sealed_result(state: AttemptState) -> str | None:
    return _str_field(state.seal if not isinstance(state, Partial) else None, "result")


def newest_sealed(
    root: Path, document: Callable[[Path], dict[str, Any] | None]
) -> dict[str, Any] | None:
    """The newest record under ``root/<attempt_id>/a-NNNN/`` (a localization, a fix search)
    that ``document`` accepts (its seal verifies), or None; links are never followed."""
    if root.is_symlink() or not root.is_dir():
        return None
    found: list[tuple[str, int, Path]] = []
    for attempt in root.iterdir():
        if attempt.is_symlink() or not attempt.is_dir():
            continue
        for entry in attempt.iterdir():
            number = attempt_number(entry.name)
            if number is not None and not entry.is_symlink():
                found.append((attempt.name, number, entry))
    for _, _, path in sorted(found, reverse=True):
        accepted = document(path)
        if accepted is not None:
            return accepted
    return None


def read_seal(path: Path) -> Mapping[str, Any] | Damaged:
    """``path/COMPLETE`` parsed (bounded, regular, an object with a ``files`` mapping)."""
    try:
        data = read_regular(path / SEAL_NAME)
    except ArtifactError as exc:
        return Damaged(("COMPLETE is malformed", exc.message))
    if data is None:  # vanished between lstat and open
        return Damaged(("COMPLETE vanished while being read",))
    try:
        seal = parse_json(data, SEAL_NAME)
    except ArtifactError as exc:
        return Damaged(("COMPLETE is malformed", exc.message))
    if not isinstance(seal, dict) or not isinstance(seal.get("files"), dict):
        return Damaged(("COMPLETE is malformed", "COMPLETE has no 'files' mapping"))
    return seal


def file_problems(path: Path, files: Mapping[str, Any], names: Sequence[str]) -> list[str]:
    """What is wrong with the sealed files of directory ``path``: entries other than
    ``names`` and ``COMPLETE``, and each of ``names`` missing, not a bounded regular file,
    or not matching its digest in ``files``. Shared by every sealed artifact (attempts,
    localizations)."""
    problems: list[str] = []
    try:
        present = {entry.name for entry in os.scandir(path)}
    except OSError as exc:
        return [f"{path.name} is not readable: {exc.strerror}"]
    extra = sorted(present - set(names) - {SEAL_NAME})
    if extra:
        problems.append(f"unexpected entries {extra}")
    for name in names:
        try:
            if sha256_file(path / name) != files.get(name):
                problems.append(f"{name} does not match its seal")
        except FileNotFoundError:
            problems.append(f"{name} is missing")
        except ArtifactError as exc:
            if exc.code in ("artifacts.symlink", "artifacts.not_a_file"):
                problems.append(f"{name} is not a regular file")
            else:
                problems.append(f"{name}: {exc.message}")
    return problems


def check_attempt(path: Path, experiment_id: str, case_id: str) -> AttemptState:
    """Check ``<...>/cases/<case_id>/<attempt>`` against its seal; never raises for damage."""
    attempt_id = path.name
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            return Damaged(("attempt is not a real directory",))
        seal_mode = os.lstat(path / SEAL_NAME).st_mode
    except FileNotFoundError:
        return Partial()
    except OSError as exc:
        return Damaged((f"attempt is not readable: {exc.strerror}",))
    if not stat.S_ISREG(seal_mode):
        return Damaged(("COMPLETE is not a regular file",))
    seal = read_seal(path)
    if isinstance(seal, Damaged):
        return seal
    problems: list[str] = []
    expected = {
        "schema": SEAL_SCHEMA,
        "experiment_id": experiment_id,
        "case_id": case_id,
        "attempt_id": attempt_id,
    }
    wrong = [k for k, v in expected.items() if seal.get(k) != v]
    if wrong:
        problems.append("COMPLETE names another attempt")
        problems += [f"COMPLETE {k} is {seal.get(k)!r}, expected {expected[k]!r}" for k in wrong]
    if set(seal) != SEAL_KEYS:
        problems.append("COMPLETE does not have exactly the seal fields")
    files: dict[str, Any] = seal["files"]
    if set(files) != set(PAYLOAD_FILES) or not all(isinstance(v, str) for v in files.values()):
        problems.append("COMPLETE does not seal the expected payloads")
        problems += [
            f"sealed file {n} is not a payload" for n in sorted(set(files) - set(PAYLOAD_FILES))
        ]
    if problems:
        return Damaged(tuple(problems), seal)
    problems = file_problems(path, files, PAYLOAD_FILES)
    if problems:
        return Damaged(tuple(problems), seal)
    # COMPLETE itself is not sealed: its result must agree with the sealed verdict.
    try:
        comparison = read_json(path / COMPARISON_NAME)
        stated = comparison["result"]
    except (ArtifactError, KeyError, TypeError) as exc:
        detail = exc.message if isinstance(exc, ArtifactError) else "it has no 'result'"
        return Damaged((f"{COMPARISON_NAME} is malformed", detail), seal)
    if seal.get("result") != stated:
        return Damaged(
            (f"COMPLETE seals result {seal.get('result')!r}, comparison.json says {stated!r}",),
            seal,
        )
    return Sealed(seal)
