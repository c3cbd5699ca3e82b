"""The sealed localization artifact: ``localize.json`` + ``taps.safetensors`` + ``COMPLETE``.

It lives at ``<run>/localize/<case_id>/<attempt_id>/a-NNNN/``, beside the case's attempt
tree rather than inside it: a sealed attempt directory holds exactly its payloads (verify
and resume reject extra entries), so localizing never touches it. Each localization is a
new ``a-NNNN`` (allocated atomically); files are published with the artifact store's
no-overwrite writer and ``COMPLETE`` (the SHA-256 of each file) is published last.
Reading it back (:func:`latest`) is torch-free, for the report.

A case that ``--localize`` (``localize=true``) could not localize is recorded the same way
with ``localize.json`` alone (``status: "error"``, the coded error and its line), so the
report says why a failing case has no chart; ``xconf localize`` itself writes nothing when
it refuses (its exit code and message say it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xconf.artifacts.layout import read_json
from xconf.artifacts.safe_io import allocate_attempt_dir, publish_bytes, real_dir
from xconf.artifacts.seal import Damaged, file_problems, read_seal
from xconf.errors import XconfError

LOCALIZE_SCHEMA = "xconf.localize.v1"
SEAL_SCHEMA = "xconf.localize.seal.v1"
FILES = ("localize.json", "taps.safetensors")
FAILURE_FILES = ("localize.json",)
SEAL = "COMPLETE"
KIND_CODES = {"embedding": 0, "attention": 1, "mlp": 2, "residual": 3, "final_norm": 4, "logits": 5}


@dataclass(frozen=True)
class Published:
    path: Path
    localize_id: str


def tap_tensors(document: dict[str, Any]) -> dict[str, Any]:
    """Per-tap summaries as tensors (one entry per tap, in execution order)."""
    import torch

    rows = document["taps"]

    def col(name: str) -> Any:
        return torch.tensor([float(r[name]) for r in rows], dtype=torch.float64)

    return {
        "layer": torch.tensor([-1 if r["layer"] is None else r["layer"] for r in rows]),
        "kind": torch.tensor([KIND_CODES[r["kind"]] for r in rows]),
        "case_relative": col("case_relative"),
        "case_max_abs": col("case_max_abs"),
        "baseline_cross": col("baseline_cross"),
        "rollout_repeat": col("rollout_repeat"),
        "training_repeat": col("training_repeat"),
        "floor": col("floor"),
        "ratio": col("ratio"),
    }


def _publish(
    run_path: Path, case_id: str, attempt_id: str, document: dict[str, Any], extra: dict[str, bytes]
) -> Published:
    from xconf.artifacts.store import json_bytes

    with real_dir(run_path, "localize", case_id, attempt_id) as parent:
        localize_id, directory = allocate_attempt_dir(parent)
        try:
            payloads = {
                "localize.json": json_bytes({**document, "localize_id": localize_id}),
                **extra,
            }
            digests = {
                name: publish_bytes(directory, name, data, staging=parent)
                for name, data in payloads.items()
            }
            seal = {
                "schema": SEAL_SCHEMA,
                "case_id": case_id,
                "attempt_id": attempt_id,
                "localize_id": localize_id,
                "files": digests,
            }
            publish_bytes(directory, SEAL, json_bytes(seal), staging=parent)
        finally:
            directory.close()
        return Published(parent.path / localize_id, localize_id)


def publish(run_path: Path, case_id: str, attempt_id: str, document: dict[str, Any]) -> Published:
    from safetensors.torch import save

    taps = save(
        {k: v.contiguous() for k, v in tap_tensors(document).items()},
        metadata={"case_id": case_id, "attempt_id": attempt_id, "schema": LOCALIZE_SCHEMA},
    )
    return _publish(run_path, case_id, attempt_id, document, {"taps.safetensors": taps})


def failure_document(case_id: str, attempt_id: str, error: XconfError) -> dict[str, Any]:
    where = f" at '{error.path}'" if error.path else ""
    return {
        "schema": LOCALIZE_SCHEMA,
        "status": "error",
        "case_id": case_id,
        "attempt_id": attempt_id,
        "error": {"code": error.code, "message": error.message, "path": error.path},
        "line": f"localize failed: [{error.code}]{where}: {error.message}",
    }


def publish_failure(run_path: Path, case_id: str, attempt_id: str, error: XconfError) -> Published:
    """Record why ``--localize`` could not localize a case (sealed like a localization)."""
    return _publish(run_path, case_id, attempt_id, failure_document(case_id, attempt_id, error), {})


def _sealed_document(path: Path) -> dict[str, Any] | None:
    """The document of a localization whose seal verifies (the artifact store's seal
    helpers: bounded regular files, depth-bounded JSON, digests), else None."""
    seal = read_seal(path)
    if isinstance(seal, Damaged) or seal.get("schema") != SEAL_SCHEMA:
        return None
    files = seal.get("files")
    names = FILES if isinstance(files, dict) and set(files) == set(FILES) else FAILURE_FILES
    if not isinstance(files, dict) or set(files) != set(names):
        return None
    if file_problems(path, files, names):
        return None
    try:
        document = read_json(path / "localize.json")
    except (OSError, XconfError):
        return None
    if not isinstance(document, dict):
        return None
    failed = document.get("status") == "error"
    return document if failed == (names == FAILURE_FILES) else None


def latest(run_path: Path, case_id: str) -> dict[str, Any] | None:
    """The newest localization of ``case_id`` whose seal verifies, or None (torch-free); a
    recorded failure (``status: "error"``) counts: it is the newest answer."""
    root = run_path / "localize" / case_id
    if root.is_symlink() or not root.is_dir():
        return None
    found: list[tuple[str, str, Path]] = []
    for attempt in root.iterdir():
        if attempt.is_symlink() or not attempt.is_dir():
            continue
        for entry in attempt.iterdir():
            if entry.name.startswith("a-") and entry.name[2:].isdigit() and not entry.is_symlink():
                found.append((attempt.name, entry.name, entry))
    for _, _, path in sorted(found, reverse=True):
        document = _sealed_document(path)
        if document is not None:
            return document
    return None
