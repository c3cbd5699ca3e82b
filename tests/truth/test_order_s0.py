"""Metamorphic, on S0: the plan run forward, reversed and one case alone scores bitwise alike.

The baseline runs with prefix caching, so the synthetic rollout engine fills its KV block
cache; the ``batch.size`` cases reuse that engine. Without a reset between cases, a reused
engine resumed decoding from blocks the previous case cached and its bits depended on what
ran before it.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path
from typing import Any

from tests.core.runs import only
from xconf.adapters.cpu_smoke.adapter import CpuSmokeRuntime
from xconf.artifacts.store import read_tensors
from xconf.config.strict import parse_experiment
from xconf.session import prepare, run_prepared

SCORES = ("score_rollout.safetensors", "score_training.safetensors")


def _run(doc: dict[str, Any], out: Path, *, reverse: bool = False, alone: str | None = None):
    prepared = prepare(
        parse_experiment(doc), output_root=out, allow_smoke_operators=False, device="cpu"
    )
    if reverse:  # the tuple the runner walks and the index it sorts by within an engine group
        flipped = tuple(
            replace(c, case=replace(c.case, index=i))
            for i, c in enumerate(reversed(prepared.execution.cases))
        )
        prepared = replace(prepared, execution=replace(prepared.execution, cases=flipped))
    ids = None
    if alone is not None:
        ids = {c.case.case_id for c in prepared.execution.cases if c.case.label() == alone}
    return run_prepared(prepared, CpuSmokeRuntime(), resume=False, case_ids=ids)


def _bits(summary: Any) -> dict[str, tuple[bytes, ...]]:
    found = {}
    for r in summary.records:
        attempt = Path(summary.experiment_dir, "cases", r.case_id, r.attempt_id)
        found[r.label] = tuple(
            read_tensors(attempt / name)["logprobs"].numpy().tobytes() for name in SCORES
        )
    return found


def test_s0_plan_forward_reversed_and_alone_score_bitwise_alike(s0_doc, tmp_path) -> None:
    doc = only(copy.deepcopy(s0_doc), batch__size=[1, 4], rollout__enforce_eager=[False])
    doc["baseline"]["rollout"]["enable_prefix_caching"] = True
    forward = _run(doc, tmp_path / "forward")
    assert forward.engines_reused > 0  # the batch cases reuse the baseline's engines
    backward = _run(copy.deepcopy(doc), tmp_path / "backward", reverse=True)
    alone = _run(copy.deepcopy(doc), tmp_path / "alone", alone="batch.size=1")
    fwd, bwd, one = _bits(forward), _bits(backward), _bits(alone)
    assert set(fwd) == set(bwd) and len(fwd) == 4, sorted(fwd)
    for label in fwd:
        assert fwd[label] == bwd[label], label
    assert one["batch.size=1"] == fwd["batch.size=1"]
