"""Writing the sealed localization artifact (format and reader: ``xconf.artifacts.localization``).

Each localization is a new ``a-NNNN`` under ``<run>/localize/<case_id>/<attempt_id>/``,
written by the artifact store's one sealed-directory writer (atomic allocation, no-overwrite
payloads, ``COMPLETE`` last).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xconf.artifacts.localization import (
    FILES,
    LOCALIZE_DIR,
    LOCALIZE_SCHEMA,
    SEAL_SCHEMA,
    TAPS_NAME,
)
from xconf.artifacts.safe_io import real_dir
from xconf.artifacts.store import json_bytes, publish_sealed

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


def publish(run_path: Path, case_id: str, attempt_id: str, document: dict[str, Any]) -> Published:
    from safetensors.torch import save

    taps = save(
        {k: v.contiguous() for k, v in tap_tensors(document).items()},
        metadata={"case_id": case_id, "attempt_id": attempt_id, "schema": LOCALIZE_SCHEMA},
    )

    def payload(localize_id: str, name: str) -> bytes:
        # The document names its own directory, known only once it is allocated.
        return taps if name == TAPS_NAME else json_bytes({**document, "localize_id": localize_id})

    def seal(localize_id: str, digests: Mapping[str, str]) -> dict[str, Any]:
        return {
            "schema": SEAL_SCHEMA,
            "case_id": case_id,
            "attempt_id": attempt_id,
            "localize_id": localize_id,
            "files": dict(digests),
        }

    with real_dir(run_path, LOCALIZE_DIR, case_id, attempt_id) as parent:
        localize_id = publish_sealed(parent, FILES, payload, seal)
        return Published(parent.path / localize_id, localize_id)
