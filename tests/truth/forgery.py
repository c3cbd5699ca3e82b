"""A forger's tools: rewrite a payload of a sealed attempt, or a plan row, and recompute every
digest that would give it away (the seal's file digests, the execution key, the plan seal)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from xconf.artifacts.layout import read_json
from xconf.artifacts.plan_seal import PLAN_DIGEST_KEY, plan_bytes, plan_digest
from xconf.runtime import rederive


def json_bytes(document: Any) -> bytes:
    return (json.dumps(document, sort_keys=True, indent=2, allow_nan=False) + "\n").encode()


def reseal(attempt: Path, name: str, data: bytes, *, rekey: bool = False) -> None:
    """Write ``data`` as ``name`` and rewrite COMPLETE so every digest matches again."""
    (attempt / name).write_bytes(data)
    seal = json.loads((attempt / "COMPLETE").read_text())
    seal["files"][name] = hashlib.sha256(data).hexdigest()
    if rekey:  # the forger also recomputes the execution key from the edited records
        docs = {n: read_json(attempt / n) for n in rederive.KEY_RECORDS}
        fields = rederive.key_fields_from_records(docs)
        assert isinstance(fields, dict)
        seal["execution_key"] = rederive.execution_key(fields)
    (attempt / "COMPLETE").write_bytes(json_bytes(seal))


def edit_json(attempt: Path, name: str, edit: Callable[[dict[str, Any]], None]) -> None:
    """``edit`` the JSON record ``name`` in place, resealed and rekeyed."""
    document = json.loads((attempt / name).read_text())
    edit(document)
    reseal(attempt, name, json_bytes(document), rekey=True)


def edit_plan(experiment_dir: Path, edit: Callable[[list[dict[str, Any]]], None]) -> None:
    """``edit`` plan.jsonl's rows, and seal the edited plan in experiment.json again."""
    plan = experiment_dir / "plan.jsonl"
    rows = [json.loads(line) for line in plan.read_text().splitlines()]
    edit(rows)
    data = plan_bytes(rows)
    plan.write_bytes(data)
    header = json.loads((experiment_dir / "experiment.json").read_text())
    header[PLAN_DIGEST_KEY] = plan_digest(data)
    (experiment_dir / "experiment.json").write_bytes(json_bytes(header))
