"""The sealed fix-search record's format and its torch-free reader.

One search of a failing case lives at ``<run>/fix/<case_id>/<attempt_id>/a-NNNN/``:
``fix.json`` (where the search started, each case it ran with its verdict, bitwise count and
effect, and the one closing line) sealed by ``COMPLETE``. The cases themselves are ordinary
cases of the run (``cases/``, their rows in ``plan_extensions/``); the record only names
them, so a reader that shows a fix checks the named case's own sealed verdict as well
(``verified_case``). ``xconf.fix.service`` writes it through the store's sealed-directory
writer; the report reads it here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from xconf.artifacts.layout import read_json
from xconf.artifacts.seal import Damaged, file_problems, newest_sealed, read_seal
from xconf.errors import XconfError

FIX_DIR = "fix"
FIX_SCHEMA = "xconf.fix.v1"
SEAL_SCHEMA = "xconf.fix.seal.v1"
DOCUMENT_NAME = "fix.json"
FILES = (DOCUMENT_NAME,)


def sealed_document(path: Path) -> dict[str, Any] | None:
    """The record at ``path`` when its seal verifies, else None."""
    seal = read_seal(path)
    if isinstance(seal, Damaged) or seal.get("schema") != SEAL_SCHEMA:
        return None
    files = seal.get("files")
    if not isinstance(files, dict) or set(files) != set(FILES) or file_problems(path, files, FILES):
        return None
    try:
        document = read_json(path / DOCUMENT_NAME)
    except (OSError, XconfError):
        return None
    if not isinstance(document, dict) or document.get("schema") != FIX_SCHEMA:
        return None
    return document


def latest(run_path: Path, case_id: str) -> dict[str, Any] | None:
    """The newest fix record of ``case_id`` whose seal verifies, or None."""
    return newest_sealed(run_path / FIX_DIR / case_id, sealed_document)


def all_latest(run_path: Path) -> list[dict[str, Any]]:
    """The newest verified record of every case the fix search ran on, by case id."""
    root = run_path / FIX_DIR
    if root.is_symlink() or not root.is_dir():
        return []
    out = []
    for case_dir in sorted(root.iterdir()):
        document = latest(run_path, case_dir.name)
        if document is not None:
            out.append(document)
    return out
