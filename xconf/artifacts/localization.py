"""The sealed localization artifact's format and its torch-free reader.

A localization lives at ``<run>/localize/<case_id>/<attempt_id>/a-NNNN/``: ``localize.json``
and ``taps.safetensors``, sealed by ``COMPLETE`` (the SHA-256 of each file). It sits beside
the case's attempt tree rather than inside it, because a sealed attempt directory holds
exactly its payloads (verify and resume reject extra entries), so localizing never touches
it. ``xconf.localize.artifact`` writes it (through the store's sealed-directory writer); the
report reads it here, so the report needs nothing of the localizer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from xconf.artifacts.layout import read_json
from xconf.artifacts.seal import Damaged, file_problems, newest_sealed, read_seal
from xconf.errors import XconfError

LOCALIZE_DIR = "localize"
LOCALIZE_SCHEMA = "xconf.localize.v1"
SEAL_SCHEMA = "xconf.localize.seal.v1"
DOCUMENT_NAME = "localize.json"
TAPS_NAME = "taps.safetensors"
FILES = (DOCUMENT_NAME, TAPS_NAME)
# A case ``--localize`` could not localize: its document alone (``status: "error"``).
FAILURE_FILES = (DOCUMENT_NAME,)


def _sealed_document(path: Path) -> dict[str, Any] | None:
    """The document of a localization whose seal verifies (the artifact store's seal
    helpers: bounded regular files, depth-bounded JSON, digests), else None."""
    seal = read_seal(path)
    if isinstance(seal, Damaged) or seal.get("schema") != SEAL_SCHEMA:
        return None
    files = seal.get("files")
    if not isinstance(files, dict):
        return None
    names = FILES if set(files) == set(FILES) else FAILURE_FILES
    if set(files) != set(names) or file_problems(path, files, names):
        return None
    try:
        document = read_json(path / DOCUMENT_NAME)
    except (OSError, XconfError):
        return None
    if not isinstance(document, dict):
        return None
    failed = document.get("status") == "error"
    return document if failed == (names == FAILURE_FILES) else None


def latest(run_path: Path, case_id: str) -> dict[str, Any] | None:
    """The newest localization of ``case_id`` whose seal verifies, or None (torch-free); a
    recorded failure (``status: "error"``) counts: it is the newest answer."""
    return newest_sealed(run_path / LOCALIZE_DIR / case_id, _sealed_document)
