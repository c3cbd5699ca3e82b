"""Append-only experiment store: sealed attempts, verification and resume discovery."""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xconf.artifacts import seal as seal_check
from xconf.artifacts.layout import (
    CASES_DIR,
    HEADER_NAME,
    NON_REUSABLE_RESULTS,
    PAYLOAD_FILES,
    PLAN_NAME,
    SEAL_KEYS,
    SEAL_NAME,
    SEAL_SCHEMA,
    attempt_number,
    parse_json,
    read_json,
    read_plan_lines,
    read_regular,
)
from xconf.artifacts.plan_extension import EXTENSIONS_DIR, extension_seal
from xconf.artifacts.plan_extension import FILES as EXTENSION_FILES
from xconf.artifacts.plan_seal import (
    PLAN_DIGEST_KEY,
    plan_bytes,
    plan_difference,
    plan_digest,
    rows_problem,
    sealed_rows,
)
from xconf.artifacts.safe_io import (
    Dir,
    Parts,
    allocate_attempt_dir,
    check_id,
    publish_bytes,
    real_dir,
)
from xconf.artifacts.seal import AttemptState, Partial
from xconf.errors import ArtifactError

# Re-exported: the format's names are owned by layout, used here and by store's callers.
__all__ = [
    "NON_REUSABLE_RESULTS",
    "PAYLOAD_FILES",
    "SEAL_KEYS",
    "SEAL_NAME",
    "SEAL_SCHEMA",
    "AttemptCheck",
    "ExperimentStore",
    "PublishedAttempt",
    "publish_sealed",
    "read_json",
    "read_tensors",
]

if TYPE_CHECKING:  # torch only where tensors are written or read: planning needs none
    import torch


def json_bytes(document: Any) -> bytes:
    return (json.dumps(document, sort_keys=True, indent=2, allow_nan=False) + "\n").encode()


@dataclass(frozen=True)
class AttemptCheck:
    """Verification of one attempt directory; ``reason`` is None when it is valid."""

    case_id: str
    attempt_id: str
    path: Path
    state: AttemptState

    @property
    def valid(self) -> bool:
        return isinstance(self.state, seal_check.Sealed)

    @property
    def partial(self) -> bool:
        return isinstance(self.state, Partial)

    @property
    def reason(self) -> str | None:
        return self.state.problems[0] if self.state.problems else None

    @property
    def seal(self) -> Mapping[str, Any] | None:
        return None if isinstance(self.state, Partial) else self.state.seal


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
        # (device, inode) of the experiment directory once this store published its plan.
        self._published: tuple[int, int] | None = None

    # -- experiment header and plan ---------------------------------------------------------
    @contextmanager
    def _locked(self) -> Iterator[Dir]:
        """The experiment directory, open and exclusively locked."""
        with real_dir(self.root, self.experiment_id) as directory:
            lock = directory.path / ".lock"
            try:
                fd = os.open(
                    ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644, dir_fd=directory.fd
                )
            except OSError as exc:
                raise ArtifactError(
                    "artifacts.lock", f"cannot open the lock file {lock}: {exc}", str(lock)
                ) from exc
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield directory
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)

    def publish_plan(self, header: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> None:
        """Seal the plan once: plan.jsonl, then experiment.json holding its digest.

        A rerun must describe the same experiment and plan the same cases or a subset of them
        (a sweep job plans its one case); anything else is an ``experiment_conflict``.
        """
        self._publish_plan(header, rows)
        info = os.stat(self.path, follow_symlinks=False)
        self._published = (info.st_dev, info.st_ino)

    def check_present(self) -> None:
        """Refuse to go on when the experiment directory this store published its plan in
        was deleted or replaced (or lost its ``experiment.json``): ``artifacts.run_dir_gone``.

        Writing on would re-create part of the tree without its header, a directory verify
        cannot recognise as a run.
        """
        if self._published is None:
            return
        try:
            info = os.stat(self.path, follow_symlinks=False)
            header = os.stat(self.path / HEADER_NAME, follow_symlinks=False)
            present = (info.st_dev, info.st_ino) == self._published and header.st_size > 0
        except OSError:
            present = False
        if not present:
            raise ArtifactError(
                "artifacts.run_dir_gone",
                f"the run directory {self.path} was deleted or replaced while the run was "
                "writing it; stopped, nothing more is written (run the same command again to "
                "start over)",
                str(self.path),
            )

    def _publish_plan(self, header: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> None:
        with self._locked() as directory:
            header_path = self.path / HEADER_NAME
            existing_bytes = read_regular(header_path)
            if existing_bytes is None:
                data = plan_bytes(rows)
                present = read_regular(self.path / PLAN_NAME)
                if present is None:
                    publish_bytes(directory, PLAN_NAME, data)
                elif present != data:
                    raise ArtifactError(
                        "artifacts.plan_seal",
                        f"{self.path / PLAN_NAME} exists without {HEADER_NAME}",
                        str(self.path / PLAN_NAME),
                    )
                sealed = {**header, PLAN_DIGEST_KEY: plan_digest(data)}
                publish_bytes(directory, HEADER_NAME, json_bytes(sealed))
                return
            try:
                existing = parse_json(existing_bytes, HEADER_NAME, str(header_path))
            except ArtifactError:
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

    def extend_plan(self, rows: Sequence[Mapping[str, Any]]) -> list[str]:
        """Seal ``rows`` as a plan extension (:mod:`xconf.artifacts.plan_extension`) of this
        run's sealed plan, so they are cases of the same experiment; a row the plan (or an
        extension) already holds is not added again. Returns the case ids added.

        Raises ``artifacts.plan_seal`` when the run's plan is not sealed, and
        ``artifacts.experiment_conflict`` when a row names a planned case id with other
        knobs or would break the plan's rules (its changes against the baseline)."""
        with self._locked() as directory:
            existing = sealed_rows(self.path)  # raises when the plan (or an extension) is damaged
            conflict = plan_difference(existing, [r for r in rows if r["case_id"] in existing])
            new = [dict(r) for r in rows if r["case_id"] not in existing]
            problem = conflict or rows_problem([*existing.values(), *new])
            if problem is not None:
                raise ArtifactError(
                    "artifacts.experiment_conflict",
                    f"cannot extend the plan of '{self.experiment_id}': {problem}",
                    str(self.path / PLAN_NAME),
                )
            if not new:
                return []
            header = read_json(self.path / HEADER_NAME)
            base = header.get(PLAN_DIGEST_KEY) if isinstance(header, dict) else None
            data = plan_bytes(new)

            def payload(extension_id: str, name: str) -> bytes:
                return data

            def seal(extension_id: str, digests: Mapping[str, str]) -> dict[str, Any]:
                return extension_seal(self.experiment_id, extension_id, str(base), digests)

            with real_dir(directory.path, EXTENSIONS_DIR) as parent:
                publish_sealed(parent, EXTENSION_FILES, payload, seal)
            return [str(r["case_id"]) for r in new]

    def planned_case_ids(self) -> set[str]:
        """Case ids of plan.jsonl; a torn or hostile line (an interrupted append) is skipped."""
        ids: set[str] = set()
        for _, row in read_plan_lines(self.path / PLAN_NAME):
            case_id = row.get("case_id") if isinstance(row, dict) else None
            if isinstance(case_id, str):
                ids.add(case_id)
        return ids

    # -- attempts -----------------------------------------------------------------------------
    def case_dir(self, case_id: str) -> Path:
        check_id(case_id, "case_id")
        with real_dir(self.root, self.experiment_id, CASES_DIR, case_id) as directory:
            return directory.path

    def publish_attempt(
        self,
        case_id: str,
        execution_key: str,
        documents: Mapping[str, Any],
        tensors: Mapping[str, Mapping[str, torch.Tensor]],
        result: str,
    ) -> PublishedAttempt:
        """Allocate an attempt, publish every payload, then seal it with COMPLETE, last
        (:func:`publish_sealed`)."""
        from xconf.artifacts.tensor_file import tensor_parts

        names = set(documents) | set(tensors)
        if names != set(PAYLOAD_FILES):
            missing = sorted(set(PAYLOAD_FILES) - names)
            raise ArtifactError("artifacts.incomplete_payload", f"missing payloads {missing}")
        check_id(case_id, "case_id")
        self.check_present()

        def payload(attempt_id: str, name: str) -> bytes | Parts:
            if name in documents:
                return json_bytes(documents[name])
            # written from the tensors' own memory: no serialized copy of a large payload
            return tensor_parts(tensors[name], {"case_id": case_id, "attempt_id": attempt_id})

        def seal(attempt_id: str, digests: Mapping[str, str]) -> dict[str, Any]:
            return {
                "schema": SEAL_SCHEMA,
                "experiment_id": self.experiment_id,
                "case_id": case_id,
                "attempt_id": attempt_id,
                "execution_key": execution_key,
                "result": result,
                "files": dict(digests),
            }

        with real_dir(self.root, self.experiment_id, CASES_DIR, case_id) as case:
            attempt_id = publish_sealed(case, PAYLOAD_FILES, payload, seal)
            return PublishedAttempt(case_id, attempt_id, case.path / attempt_id, result)

    def attempts(self, case_id: str) -> list[Path]:
        """Attempt directories of a case, newest first."""
        case_dir = self.path / CASES_DIR / case_id
        if case_dir.is_symlink() or not case_dir.is_dir():
            return []
        found = [p for p in case_dir.iterdir() if attempt_number(p.name) is not None]
        return sorted(found, key=lambda p: attempt_number(p.name) or 0, reverse=True)

    def case_ids(self) -> list[str]:
        cases = self.path / CASES_DIR
        if cases.is_symlink() or not cases.is_dir():
            return []
        return sorted(p.name for p in cases.iterdir())

    def verify_attempt(self, path: Path) -> AttemptCheck:
        """The attempt checked against its seal (``xconf.artifacts.seal``, the one checker)."""
        state = seal_check.check_attempt(path, self.experiment_id, path.parent.name)
        return AttemptCheck(path.parent.name, path.name, path, state)

    def identity_conflict(self, identity: Mapping[str, Any]) -> str | None:
        """The fields in which ``identity`` (the frozen identity this run scores) differs from
        the one a sealed attempt of this experiment recorded, or None.

        One experiment id holds one frozen identity: another checkpoint digest, tokenizer or
        data set under the same id is a conflict, never more attempts under the old name. An
        identity.json that is not the digest of its own fields is damage (resume rescores it),
        not a conflict.
        """
        from xconf.canonical import canonical_digest

        for case_id in self.case_ids():
            for path in self.attempts(case_id):
                if not (path / SEAL_NAME).is_file():
                    continue  # a partial attempt records nothing
                try:
                    stored = read_json(path / "identity.json")
                except ArtifactError:
                    continue
                if not isinstance(stored, dict):
                    continue
                inner = {k: v for k, v in stored.items() if k != "sha256"}
                if stored.get("sha256") != canonical_digest(inner):
                    continue
                differing = sorted(
                    k for k in set(inner) | set(identity) if inner.get(k) != identity.get(k)
                )
                if differing:
                    return f"{case_id}/{path.name} recorded another {', '.join(differing)}"
                break  # the newest sealed attempt of a case speaks for it
        return None

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


def publish_sealed(
    parent: Dir,
    names: Sequence[str],
    payload: Callable[[str, str], bytes | Parts],
    seal: Callable[[str, Mapping[str, str]], Mapping[str, Any]],
) -> str:
    """The one writer of a sealed directory: allocate a new ``a-NNNN`` under ``parent``,
    publish each of ``names`` (bytes from ``payload(attempt_id, name)``) with the
    no-overwrite writer, then ``COMPLETE`` (``seal(attempt_id, digests)``) last, so a
    directory without ``COMPLETE`` is partial and never read as a result. Every file is
    written relative to the new directory's open descriptor: the directory swapped for a
    symlink after its creation redirects nothing. Returns the new directory's name."""
    attempt_id, directory = allocate_attempt_dir(parent)
    try:
        digests = {
            name: publish_bytes(directory, name, payload(attempt_id, name), staging=parent)
            for name in names
        }
        publish_bytes(directory, SEAL_NAME, json_bytes(seal(attempt_id, digests)), staging=parent)
    finally:
        directory.close()
    return attempt_id


def read_tensors(path: Path) -> dict[str, torch.Tensor]:
    """safetensors only, from a bounded regular file: no pickle, no link, no FIFO."""
    from safetensors.torch import load

    data = read_regular(path)
    if data is None:
        raise ArtifactError("artifacts.missing", f"{path.name} is missing", str(path))
    return load(data)
