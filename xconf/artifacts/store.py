"""Append-only experiment store: sealed attempts, verification and resume discovery."""

from __future__ import annotations

import fcntl
import json
import os
import stat
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save

from xconf.artifacts.layout import PAYLOAD_FILES, SEAL_NAME, SEAL_SCHEMA
from xconf.artifacts.plan_seal import (
    PLAN_DIGEST_KEY,
    PLAN_NAME,
    plan_bytes,
    plan_difference,
    plan_digest,
    sealed_rows,
)
from xconf.artifacts.safe_io import (
    allocate_attempt_dir,
    check_id,
    ensure_real_dir,
    publish_bytes,
    read_regular,
    sha256_file,
)
from xconf.errors import ArtifactError

NON_REUSABLE_RESULTS = frozenset({"error"})
SEAL_KEYS = frozenset(
    {"schema", "experiment_id", "case_id", "attempt_id", "execution_key", "result", "files"}
)


def json_bytes(document: Any) -> bytes:
    return (json.dumps(document, sort_keys=True, indent=2, allow_nan=False) + "\n").encode()


@dataclass(frozen=True)
class AttemptCheck:
    """Verification of one attempt directory; ``reason`` is None when it is valid."""

    case_id: str
    attempt_id: str
    path: Path
    reason: str | None
    seal: Mapping[str, Any] | None

    @property
    def valid(self) -> bool:
        return self.reason is None


@dataclass(frozen=True)
class PublishedAttempt:
    case_id: str
    attempt_id: str
    path: Path
    result: str


class ExperimentStore:
    """``<output root>/<experiment_id>/``: nothing is overwritten, no link is followed."""

    def __init__(self, output_root: str | Path, experiment_id: str) -> None:
        self.root = Path(output_root).absolute()
        self.experiment_id = check_id(experiment_id, "experiment_id")
        self.path = self.root / experiment_id

    # -- experiment header and plan ---------------------------------------------------------
    @contextmanager
    def _locked(self) -> Iterator[None]:
        ensure_real_dir(self.root, self.experiment_id)
        lock = self.path / ".lock"
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as exc:
            raise ArtifactError(
                "artifacts.lock", f"cannot open the lock file {lock}: {exc}", str(lock)
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def publish_plan(self, header: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> None:
        """Seal the plan once: plan.jsonl, then experiment.json holding its digest.

        A rerun must describe the same experiment and plan the same cases or a subset of them
        (a sweep job plans its one case); anything else is an ``experiment_conflict``.
        """
        with self._locked():
            header_path = self.path / "experiment.json"
            existing_bytes = read_regular(header_path)
            if existing_bytes is None:
                data = plan_bytes(rows)
                if read_regular(self.path / PLAN_NAME) is None:
                    publish_bytes(self.path, PLAN_NAME, data)
                elif read_regular(self.path / PLAN_NAME) != data:
                    raise ArtifactError(
                        "artifacts.plan_seal",
                        f"{self.path / PLAN_NAME} exists without experiment.json",
                        str(self.path / PLAN_NAME),
                    )
                sealed = {**header, PLAN_DIGEST_KEY: plan_digest(data)}
                publish_bytes(self.path, "experiment.json", json_bytes(sealed))
                return
            try:
                existing = json.loads(existing_bytes.decode("utf-8"))
            except (ValueError, UnicodeDecodeError):
                existing = None
            unsealed = dict(existing) if isinstance(existing, dict) else None
            if unsealed is not None:
                unsealed.pop(PLAN_DIGEST_KEY, None)
            if unsealed != json.loads(json_bytes(header)):
                raise ArtifactError(
                    "artifacts.experiment_conflict",
                    f"{header_path} describes a different experiment with the same id; "
                    "choose another experiment_id or output root",
                    "experiment_id",
                )
            difference = plan_difference(sealed_rows(self.path), rows)
            if difference is not None:
                raise ArtifactError(
                    "artifacts.experiment_conflict",
                    f"experiment '{self.experiment_id}' under {self.root} was planned with "
                    f"another plan: {difference}; choose another experiment_id (or output "
                    "root) for this plan",
                    "experiment_id",
                )

    def planned_case_ids(self) -> set[str]:
        ids: set[str] = set()
        data = read_regular(self.path / "plan.jsonl")
        if data is None:
            return ids
        for line in data.decode("utf-8", "replace").splitlines():
            try:
                ids.add(json.loads(line)["case_id"])
            except (ValueError, KeyError, TypeError):
                continue  # a torn line from an interrupted append
        return ids

    # -- attempts -----------------------------------------------------------------------------
    def case_dir(self, case_id: str) -> Path:
        return ensure_real_dir(self.root, self.experiment_id, "cases", check_id(case_id, "case_id"))

    def publish_attempt(
        self,
        case_id: str,
        execution_key: str,
        documents: Mapping[str, Any],
        tensors: Mapping[str, Mapping[str, torch.Tensor]],
        result: str,
    ) -> PublishedAttempt:
        """Allocate an attempt, publish every payload, then seal it with COMPLETE, last."""
        names = set(documents) | set(tensors)
        if names != set(PAYLOAD_FILES):
            missing = sorted(set(PAYLOAD_FILES) - names)
            raise ArtifactError("artifacts.incomplete_payload", f"missing payloads {missing}")
        attempt_id, path = allocate_attempt_dir(self.case_dir(case_id))
        digests = {}
        for name in PAYLOAD_FILES:
            if name in documents:
                data = json_bytes(documents[name])
            else:
                data = save(
                    {k: v.contiguous() for k, v in tensors[name].items()},
                    metadata={"case_id": case_id, "attempt_id": attempt_id},
                )
            digests[name] = publish_bytes(path, name, data, staging=path.parent)
        seal = {
            "schema": SEAL_SCHEMA,
            "experiment_id": self.experiment_id,
            "case_id": case_id,
            "attempt_id": attempt_id,
            "execution_key": execution_key,
            "result": result,
            "files": digests,
        }
        publish_bytes(path, SEAL_NAME, json_bytes(seal), staging=path.parent)
        return PublishedAttempt(case_id, attempt_id, path, result)

    def attempts(self, case_id: str) -> list[Path]:
        """Attempt directories of a case, newest first."""
        case_dir = self.path / "cases" / case_id
        if case_dir.is_symlink() or not case_dir.is_dir():
            return []
        found = [p for p in case_dir.iterdir() if p.name.startswith("a-") and p.name[2:].isdigit()]
        return sorted(found, key=lambda p: int(p.name[2:]), reverse=True)

    def case_ids(self) -> list[str]:
        cases = self.path / "cases"
        if cases.is_symlink() or not cases.is_dir():
            return []
        return sorted(p.name for p in cases.iterdir())

    def verify_attempt(self, path: Path) -> AttemptCheck:
        case_id, attempt_id = path.parent.name, path.name

        def bad(reason: str, seal: Mapping[str, Any] | None = None) -> AttemptCheck:
            return AttemptCheck(case_id, attempt_id, path, reason, seal)

        try:
            mode = os.lstat(path).st_mode
            if not stat.S_ISDIR(mode):
                return bad("attempt is not a real directory")
            seal_path = path / SEAL_NAME
            seal_mode = os.lstat(seal_path).st_mode
        except FileNotFoundError:
            return bad("no COMPLETE seal (partial attempt)")
        if not stat.S_ISREG(seal_mode):
            return bad("COMPLETE is not a regular file")
        try:
            seal = json.loads(seal_path.read_text("utf-8"))
            files = dict(seal["files"])
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            return bad("COMPLETE is malformed")
        if (
            seal.get("schema") != SEAL_SCHEMA
            or seal.get("case_id") != case_id
            or seal.get("attempt_id") != attempt_id
            or seal.get("experiment_id") != self.experiment_id
        ):
            return bad("COMPLETE names another attempt", seal)
        if set(seal) != SEAL_KEYS:
            return bad("COMPLETE does not have exactly the seal fields", seal)
        if set(files) != set(PAYLOAD_FILES):
            return bad("COMPLETE does not seal the expected payloads", seal)
        present = {p.name for p in path.iterdir()}
        extra = sorted(present - set(files) - {SEAL_NAME})
        if extra:
            return bad(f"unexpected entries {extra}", seal)
        for name, digest in files.items():
            try:
                file_mode = os.lstat(path / name).st_mode
            except FileNotFoundError:
                return bad(f"{name} is missing", seal)
            if not stat.S_ISREG(file_mode):
                return bad(f"{name} is not a regular file", seal)
            if sha256_file(path / name) != digest:
                return bad(f"{name} does not match its seal", seal)
        # The seal itself is not sealed: its result must agree with the sealed verdict.
        try:
            sealed_result = json.loads((path / "comparison.json").read_text("utf-8"))["result"]
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            return bad("comparison.json is malformed", seal)
        if seal.get("result") != sealed_result:
            return bad("COMPLETE and comparison.json disagree on the result", seal)
        return AttemptCheck(case_id, attempt_id, path, None, seal)

    def find_reusable(
        self,
        case_id: str,
        execution_key: str,
        accept: Callable[[AttemptCheck], bool] | None = None,
    ) -> AttemptCheck | None:
        """The newest valid, sealed attempt with this execution key and a reusable result.

        ``accept`` may still refuse a candidate (the runner re-judges it from its tensors);
        an older candidate is tried next.
        """
        for path in self.attempts(case_id):
            check = self.verify_attempt(path)
            if not check.valid or check.seal is None:
                continue
            if check.seal.get("execution_key") != execution_key:
                continue
            if check.seal.get("result") in NON_REUSABLE_RESULTS:
                continue
            if accept is not None and not accept(check):
                continue
            return check
        return None


def read_json(path: Path) -> Any:
    return json.loads(path.read_text("utf-8"))


def read_tensors(path: Path) -> dict[str, torch.Tensor]:
    """safetensors only: no pickle is ever loaded from an artifact."""
    return load_file(str(path))
