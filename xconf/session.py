"""The one service behind `xconf`, `xconf-run` and `xconf-run -m`: plan -> publish -> run ->
verdict -> report.

The front-ends (``cli/main.py``, ``cli/hydra_app.py``, ``cli/multirun_job.py``) parse their own
input into an :class:`ExperimentSpec`, a runtime config and one :class:`RunOptions`, hand
them to :func:`plan` or :func:`run` with a :class:`View` that draws the terminal (and any
:class:`AfterVerdict` hooks, such as ``--localize``), and exit with the returned
:class:`Outcome`'s code. Nothing here keeps state between calls.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from omegaconf import DictConfig

from xconf.artifacts.store import ExperimentStore
from xconf.case_record import RunStep
from xconf.errors import ConfigError, XconfError
from xconf.execution_plan import ExecutionPlan, build_execution_plan
from xconf.experiment import PLAN_SCHEMA, ExperimentSpec
from xconf.operators.catalog import ResolutionPolicy, SemanticOperatorCatalog
from xconf.planner import plan_experiment, same_as_baseline
from xconf.run_output import OutputPolicy, third_party_output
from xconf.runtime.input_limits import check_runtime_limits
from xconf.runtime.loading import instantiate_runtime

if TYPE_CHECKING:
    from xconf.case_record import CaseRecord, RunSummary

Mode = Literal["plan", "run"]
EXIT_OK, EXIT_NON_PASS, EXIT_INVALID = 0, 1, 2


def make_catalog(allow_smoke_operators: bool) -> SemanticOperatorCatalog:
    catalog = SemanticOperatorCatalog.from_entry_points()
    if allow_smoke_operators:
        from xconf.testing.smoke_ops import register_smoke_operators

        register_smoke_operators(catalog)
    return catalog


@dataclass(frozen=True)
class RunOptions:
    """How one run goes, read once by its front end from the command line or the composed
    config; the runtime config and the experiment are separate inputs."""

    output_root: str | Path
    allow_smoke_operators: bool = False
    resume: bool = True
    # A side whose scores a case before it in this run already gave is not scored again.
    reuse_sides: bool = True
    # Longer than this, a case is stopped and recorded as result error (None: no limit).
    case_timeout_s: float | None = None
    # Third-party output (vLLM, transformers, torch) on the terminal, not in xconf.log.
    verbose: bool = False

    @classmethod
    def from_config(cls, cfg: DictConfig) -> RunOptions:
        """The options of a config composed by ``xconf-run`` (``conf/config.yaml``'s keys);
        ``output_root`` resolved against Hydra's original working directory."""
        import hydra

        from xconf.runtime.deadline import check_case_timeout

        return cls(
            output_root=hydra.utils.to_absolute_path(str(cfg.output_root)),
            allow_smoke_operators=bool(cfg.allow_smoke_operators),
            resume=bool(cfg.resume),
            reuse_sides=bool(cfg.get("reuse_sides", True)),
            case_timeout_s=check_case_timeout(cfg.get("case_timeout_s")),
            verbose=bool(cfg.get("verbose", False)),
        )


class AfterVerdict(Protocol):
    """Work a front end adds after the verdict table and before the report (``--localize``),
    so the report includes what it wrote: it gets the run's summary, its adapter (engines may
    be reused) and where third-party output goes (``output``, under the run directory)."""

    def __call__(self, summary: RunSummary, adapter: Any, output: OutputPolicy, /) -> None: ...


@dataclass(frozen=True)
class Prepared:
    execution: ExecutionPlan
    store: ExperimentStore
    policy: ResolutionPolicy
    catalog: SemanticOperatorCatalog


def plan_header(execution: ExecutionPlan) -> dict[str, Any]:
    plan = execution.plan
    spec = plan.spec
    return {
        "schema": PLAN_SCHEMA,
        "experiment_id": spec.experiment_id,
        "scenario_id": spec.scenario_id,
        "scenario": spec.scenario.to_dict(),
        "identity_sha256": spec.identity.digest(),
        "contract": {
            "version": plan.contract_version,
            "sha256": plan.contract_sha256,
            "source": spec.contract_source,
        },
    }


def prepare(
    spec: ExperimentSpec,
    *,
    output_root: str | Path,
    allow_smoke_operators: bool,
    device: str,
    runtime: Mapping[str, Any] | DictConfig | None = None,
) -> Prepared:
    """Plan and bind operators; raises before anything is written when input is invalid.

    ``runtime``: the runtime config of the run or the plan; the identity's explicit rows are
    checked against the vocabulary and context its adapter names (no engine is built, no
    adapter imported). None (``xconf plan`` without ``--runtime``): no model to check against.
    """
    plan = plan_experiment(spec)
    # A runtime for another device is refused as such when the run starts (device_mismatch).
    if runtime is not None and device == spec.scenario.device:
        check_runtime_limits(spec.identity, runtime, spec.scenario.device)
    policy = ResolutionPolicy(allow_smoke_operators=allow_smoke_operators, device=device)
    catalog = make_catalog(allow_smoke_operators)
    execution = build_execution_plan(plan, catalog, policy)
    store = ExperimentStore(output_root, spec.experiment_id)
    return Prepared(execution, store, policy, catalog)


def publish_plan(prepared: Prepared) -> None:
    rows = [case.to_row() for case in prepared.execution.cases]
    covered = same_as_baseline(prepared.execution.plan)
    if covered and rows and rows[0]["kind"] == "baseline":
        # Declared values equal to the baseline add no case: the baseline row says so.
        rows[0]["same_as_baseline"] = {path: value for path, value in covered}
    prepared.store.publish_plan(plan_header(prepared.execution), rows)


def run_prepared(
    prepared: Prepared,
    adapter: Any,
    *,
    resume: bool,
    on_case: Any = None,
    case_ids: set[str] | None = None,
    case_timeout_s: float | None = None,
    output: OutputPolicy | None = None,
    on_step: Callable[[RunStep], None] | None = None,
    reuse_sides: bool = True,
) -> RunSummary:
    """``output``: where third-party output goes while cases run (``None``: untouched).
    ``on_case``: told of each finished case; ``on_step``: of the long steps between them
    (the identity frozen, each engine built), with their seconds."""
    scenario_device = prepared.execution.plan.spec.scenario.device
    if scenario_device != adapter.device:
        raise ConfigError(
            "runtime.device_mismatch",
            f"runtime '{adapter.runtime_kind}' runs on {adapter.device}, the scenario declares "
            f"{scenario_device}; plan it with mode=plan or choose a {scenario_device} runtime",
            "scenario.device",
        )
    check_inputs = getattr(adapter, "check_inputs", None)
    if check_inputs is not None:  # the runtime's own input files (datasets): before any write
        check_inputs(prepared.execution.plan.spec.identity)
    from xconf.runner import PairedRunner  # torch: only a run needs it, never a plan

    runner = PairedRunner(
        prepared.execution,
        adapter,
        prepared.store,
        prepared.catalog,
        prepared.policy,
        resume=resume,
        reuse_sides=reuse_sides,
        on_case=on_case,
        case_timeout_s=case_timeout_s,
        on_step=on_step,
    )
    with third_party_output(prepared.store.path, output):
        try:
            # Frozen before anything is written: a checkpoint that only an engine can refuse
            # (a recipe's first engine samples the identity) is refused with nothing on disk.
            started = time.perf_counter()
            identity = adapter.freeze_identity(prepared.execution.plan.spec.identity)
            if on_step is not None:
                on_step(RunStep("identity", "identity frozen", time.perf_counter() - started))
            publish_plan(prepared)
            return runner.run(case_ids, identity=identity)
        finally:
            adapter.close()


def exit_code(records: list[CaseRecord]) -> int:
    return EXIT_OK if all(r.result == "pass" for r in records) else EXIT_NON_PASS


def report_error(error: XconfError) -> None:
    from xconf.shown_text import shown  # messages carry file, runtime and model text

    where = f" at '{shown(error.path)}'" if error.path else ""
    print(f"xconf: error [{error.code}]{where}: {shown(error.message)}", file=sys.stderr)
    for issue in getattr(error, "issues", ())[1:]:
        print(
            shown(f"xconf: error [{issue.code}] at '{issue.path}': {issue.message}"),
            file=sys.stderr,
        )


# -- the flow ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """What one invocation ended with; the front-end exits with ``exit_code``."""

    exit_code: int
    prepared: Prepared | None = None
    summary: RunSummary | None = None
    error: XconfError | None = None


@dataclass(frozen=True)
class RunProgress:
    """What a view is told while cases run: each finished case (``case``), and each step
    between them (``step``): the identity frozen, an engine built."""

    case: Callable[[CaseRecord], None]
    step: Callable[[RunStep], None]


class View(Protocol):
    """How a front-end shows the flow; the service decides what happens and in which order."""

    console: Any

    def planned(self, prepared: Prepared, note: str) -> None: ...

    def progress(self, total: int) -> AbstractContextManager[RunProgress]: ...

    def verdict(self, summary: RunSummary) -> None: ...


@runtime_checkable
class OutcomeReceiver(Protocol):
    """The task function of a sweep Hydra runs on its behalf (``xconf-run -m``): it gives the
    sweep its view and receives the sweep's outcome."""

    def sweep_view(self) -> View: ...

    def receive(self, outcome: Outcome) -> None: ...


def guarded(step: Callable[[], Outcome]) -> Outcome:
    """Run one front-end step: invalid input becomes a printed coded error and exit 2; a
    SIGINT/SIGTERM stops it, ends every process it started and exits 130/143, recording no
    verdict for the case in flight (the same command resumes)."""
    from xconf.interrupts import Interrupted, end_descendants, stop_on_signals

    try:
        with stop_on_signals():
            return step()
    except Interrupted as stop:
        ended = end_descendants()
        print(
            f"xconf: {stop}; stopped (the case in flight has no verdict, {ended} child "
            "process(es) ended); run the same command again to resume",
            file=sys.stderr,
        )
        return Outcome(stop.exit_code)
    except XconfError as exc:
        report_error(exc)
        return Outcome(EXIT_INVALID, error=exc)
    except Exception as exc:
        # An OmegaConf error (e.g. an override with an unresolvable ${...}) can only come from
        # a step that loaded OmegaConf; `xconf plan` never does, so it is not imported here.
        errors = sys.modules.get("omegaconf.errors")
        if errors is None or not isinstance(exc, errors.OmegaConfBaseException):
            raise
        key = getattr(exc, "full_key", None)
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        coded = ConfigError("config.unresolvable", message, str(key) if key else None)
        report_error(coded)
        return Outcome(EXIT_INVALID, error=coded)


def plan(
    spec: ExperimentSpec,
    *,
    output_root: str | Path,
    view: View,
    note: str = "",
    runtime: Mapping[str, Any] | DictConfig | None = None,
) -> Outcome:
    """Plan and publish ``plan.jsonl``; no engine is built and nothing is scored.

    ``runtime``: the runtime the plan is for (its options and input limits are checked)."""
    if runtime is not None:
        from xconf.runtime.loading import check_options_unimported

        # A plan builds no runtime, but an option it would refuse is refused here too.
        check_options_unimported(runtime)
    prepared = prepare(
        spec,
        output_root=output_root,
        allow_smoke_operators=True,
        device=spec.scenario.device,
        runtime=runtime,
    )
    publish_plan(prepared)
    view.planned(prepared, note)
    return Outcome(EXIT_OK, prepared=prepared)


def run(
    spec: ExperimentSpec,
    runtime: Mapping[str, Any] | DictConfig,
    options: RunOptions,
    *,
    view: View | None,
    after_verdict: Sequence[AfterVerdict] = (),
) -> Outcome:
    """Plan, score every case on both sides, judge, seal; then the verdict and the report.

    ``view=None`` runs silently and writes no report: one case of a sweep, whose verdict the
    sweep's parent gathers and reports (``after_verdict`` does not run either). Third-party
    output (vLLM, transformers, torch) goes to ``<experiment dir>/xconf.log`` unless
    ``options.verbose``. Each ``after_verdict`` hook runs after the verdict, before the report.
    """
    adapter = instantiate_runtime(runtime)
    prepared = prepare(
        spec,
        output_root=options.output_root,
        allow_smoke_operators=options.allow_smoke_operators,
        device=adapter.device,
        runtime=runtime,
    )
    with _progress(view, len(prepared.execution.cases)) as progress:
        output = OutputPolicy(options.verbose, None if view is None else view.console)
        summary = run_prepared(
            prepared,
            adapter,
            resume=options.resume,
            on_case=None if progress is None else progress.case,
            case_timeout_s=options.case_timeout_s,
            output=output,
            on_step=None if progress is None else progress.step,
            reuse_sides=options.reuse_sides,
        )
    if view is None:
        return Outcome(exit_code(summary.records), prepared=prepared, summary=summary)

    def hooks() -> None:
        for hook in after_verdict:
            hook(summary, adapter, output)

    return conclude(summary, view, prepared, hooks if after_verdict else None)


def conclude(
    summary: RunSummary,
    view: View,
    prepared: Prepared | None = None,
    after_verdict: Callable[[], None] | None = None,
) -> Outcome:
    """The verdict table, then the report (never on the verdict's path: it cannot change it).

    ``after_verdict`` runs between the two, so the report includes what it wrote.
    """
    from xconf.report.writer import report_after_run

    view.verdict(summary)
    if after_verdict is not None:
        after_verdict()
    report_after_run(summary.experiment_dir, view.console)
    return Outcome(exit_code(summary.records), prepared=prepared, summary=summary)


def _progress(view: View | None, total: int) -> AbstractContextManager[RunProgress | None]:
    if view is not None:
        return view.progress(total)
    from contextlib import nullcontext

    return nullcontext(None)
