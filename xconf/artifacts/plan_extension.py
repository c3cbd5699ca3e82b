"""Sealed plan extensions: cases added to a finished run's plan, and their torch-free reader.

``plan.jsonl`` is written once and sealed by ``experiment.json``; nothing overwrites it. A
later step that runs more cases of the *same* experiment on the same frozen tokens (the fix
search, :mod:`xconf.fix`) seals their plan rows first, as an extension:

```
<run>/plan_extensions/a-NNNN/
    plan.jsonl    the added rows, in the plan's own row format
    COMPLETE      {schema, experiment_id, extension_id, base_plan_sha256, files}
```

written by the artifact store's one sealed-directory writer (``store.publish_sealed``). The
seal names the run and the digest of the plan it extends, so an extension copied from
another run (or kept after plan.jsonl was swapped) is damage, not more cases. A directory
without ``COMPLETE`` is an interrupted publication: its rows were never run and count for
nothing. Every reader of the plan (run, resume, verify, report, localize) reads the sealed
plan *and* its sealed extensions through :func:`extension_rows`; the rules a plan row obeys
(``plan_seal.rows_problem``, one row per case id) hold over both.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xconf.artifacts.layout import PLAN_NAME, attempt_number, read_plan_lines
from xconf.artifacts.seal import Damaged, file_problems, read_seal
from xconf.errors import ArtifactError

EXTENSIONS_DIR = "plan_extensions"
EXTENSION_SEAL_SCHEMA = "xconf.plan_extension.v1"
EXTENSION_SEAL_KEYS = frozenset(
    {"schema", "experiment_id", "extension_id", "base_plan_sha256", "files"}
)
FILES = (PLAN_NAME,)


@dataclass(frozen=True)
class Extensions:
    """The rows of every sealed extension (in extension order), and what is wrong with the
    extensions that do not verify (each names its directory)."""

    rows: tuple[dict[str, Any], ...]
    problems: tuple[str, ...]


def extension_seal(
    experiment_id: str, extension_id: str, base_plan_sha256: str, digests: Mapping[str, str]
) -> dict[str, Any]:
    return {
        "schema": EXTENSION_SEAL_SCHEMA,
        "experiment_id": experiment_id,
        "extension_id": extension_id,
        "base_plan_sha256": base_plan_sha256,
        "files": dict(digests),
    }


def _one(path: Path, experiment_id: str, base_plan_sha256: str | None) -> list[dict[str, Any]]:
    where = f"{EXTENSIONS_DIR}/{path.name}"
    seal = read_seal(path)
    if isinstance(seal, Damaged):
        raise ArtifactError("artifacts.plan_extension", f"{where}: {seal.problems[-1]}", str(path))
    expected = {
        "schema": EXTENSION_SEAL_SCHEMA,
        "experiment_id": experiment_id,
        "extension_id": path.name,
        "base_plan_sha256": base_plan_sha256,
    }
    wrong = [k for k, v in expected.items() if seal.get(k) != v]
    if wrong or set(seal) != EXTENSION_SEAL_KEYS:
        shown = ", ".join(wrong) or "its fields"
        raise ArtifactError(
            "artifacts.plan_extension",
            f"{where}: COMPLETE does not seal an extension of this run's plan ({shown})",
            str(path),
        )
    problems = file_problems(path, seal["files"], FILES)
    if set(seal["files"]) != set(FILES) or problems:
        raise ArtifactError(
            "artifacts.plan_extension",
            f"{where}: {'; '.join(problems) or 'COMPLETE seals other files'}",
            str(path),
        )
    rows = []
    for number, row in read_plan_lines(path / PLAN_NAME):
        if isinstance(row, ArtifactError) or not isinstance(row, dict):
            raise ArtifactError(
                "artifacts.plan_extension", f"{where}: line {number} is not a plan row", str(path)
            )
        rows.append(row)
    return rows


def extension_rows(
    experiment_dir: Path, experiment_id: str, base_plan_sha256: str | None
) -> Extensions:
    """Every sealed extension's rows; never raises for damage (each becomes a problem). An
    unsealed (partial) extension is skipped: its rows were never run."""
    root = experiment_dir / EXTENSIONS_DIR
    if not root.exists() and not root.is_symlink():
        return Extensions((), ())
    if root.is_symlink() or not root.is_dir():
        return Extensions((), (f"{EXTENSIONS_DIR} is not a real directory",))
    rows: list[dict[str, Any]] = []
    problems: list[str] = []
    entries = sorted(root.iterdir(), key=lambda p: attempt_number(p.name) or -1)
    for path in entries:
        if attempt_number(path.name) is None:
            if not path.name.startswith("."):  # staging files of an interrupted publication
                problems.append(f"{EXTENSIONS_DIR}/{path.name} is not an extension")
            continue
        if path.is_symlink() or not path.is_dir():
            problems.append(f"{EXTENSIONS_DIR}/{path.name} is not a real directory")
            continue
        if not (path / "COMPLETE").exists() and not (path / "COMPLETE").is_symlink():
            continue  # partial: never sealed, never run
        try:
            rows.extend(_one(path, experiment_id, base_plan_sha256))
        except ArtifactError as exc:
            problems.append(exc.message)
    return Extensions(tuple(rows), tuple(problems))
