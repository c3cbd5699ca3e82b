"""Writing the sealed localization artifact (format and reader: ``xconf.artifacts.localization``).

Each localization is a new ``a-NNNN`` under ``<run>/localize/<case_id>/<attempt_id>/``,
written by the artifact store's one sealed-directory writer (atomic allocation, no-overwrite
payloads, ``COMPLETE`` last).

A case that ``--localize`` (``localize=true``) could not localize is recorded the same way
with ``localize.json`` alone (``status: "error"``, the coded error and its line), so the
report says why a failing case has no chart; ``xconf localize`` itself writes nothing when
it refuses (its exit code and message say it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xconf.artifacts.localization import (
    DOCUMENT_NAME,
    LOCALIZE_DIR,
    LOCALIZE_SCHEMA,
    SEAL_SCHEMA,
    TAPS_NAME,
)
from xconf.artifacts.safe_io import real_dir
from xconf.artifacts.store import json_bytes, publish_sealed
from xconf.errors import XconfError

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
    run_path: Path,
    case_id: str,
    attempt_id: str,
    document: dict[str, Any],
    extra: Mapping[str, bytes],
) -> Published:
    names = (DOCUMENT_NAME, *extra)

    def payload(localize_id: str, name: str) -> bytes:
        # The document names its own directory, known only once it is allocated.
        if name == DOCUMENT_NAME:
            return json_bytes({**document, "localize_id": localize_id})
        return extra[name]

    def seal(localize_id: str, digests: Mapping[str, str]) -> dict[str, Any]:
        return {
            "schema": SEAL_SCHEMA,
            "case_id": case_id,
            "attempt_id": attempt_id,
            "localize_id": localize_id,
            "files": dict(digests),
        }

    with real_dir(run_path, LOCALIZE_DIR, case_id, attempt_id) as parent:
        localize_id = publish_sealed(parent, names, payload, seal)
        return Published(parent.path / localize_id, localize_id)


def publish(run_path: Path, case_id: str, attempt_id: str, document: dict[str, Any]) -> Published:
    from safetensors.torch import save

    taps = save(
        {k: v.contiguous() for k, v in tap_tensors(document).items()},
        metadata={"case_id": case_id, "attempt_id": attempt_id, "schema": LOCALIZE_SCHEMA},
    )
    return _publish(run_path, case_id, attempt_id, document, {TAPS_NAME: taps})


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
