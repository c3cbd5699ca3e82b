"""The plain CLI: `xconf plan`, `xconf run`, `xconf verify`, `xconf report`, `xconf localize`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console

from xconf.cli import localize as localize_cli
from xconf.cli.render import case_progress, make_console, plan_table, print_reasons, verdict_table
from xconf.cli.session import (
    EXIT_INVALID,
    EXIT_OK,
    exit_code,
    instantiate_runtime,
    prepare,
    publish_plan,
    report_error,
    run_prepared,
    runtime_config,
)
from xconf.config.strict import load_experiment_file
from xconf.errors import XconfError
from xconf.report.writer import report_after_run
from xconf.runtime.deadline import check_case_timeout


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="xconf", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    plan = sub.add_parser("plan", help="validate and expand an experiment; build no engine")
    plan.add_argument("file", type=Path)
    plan.add_argument("--output-root", default="outputs")
    run = sub.add_parser("run", help="plan, score every case on both sides, judge, seal")
    run.add_argument("file", type=Path)
    run.add_argument("--runtime", required=True, help="runtime adapter, e.g. cpu-smoke")
    run.add_argument(
        "--allow-smoke-operators",
        action="store_true",
        help="register and authorize the smoke-only operators",
    )
    run.add_argument("--no-resume", action="store_true", help="score again even if sealed")
    run.add_argument(
        "--case-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="stop a case that runs longer and record it as result error (runtime.case_timeout)",
    )
    run.add_argument("--output-root", default="outputs")
    run.add_argument(
        "--localize",
        action="store_true",
        help="after the run, localize every failing case (see `xconf localize`)",
    )
    verify = sub.add_parser(
        "verify",
        help="recompute every seal and verdict of a run offline "
        "(exit 0 valid, 1 damaged, 2 bad RUN_DIR, 3 incomplete)",
    )
    verify.add_argument("run_dir", type=Path, help="<output root>/<experiment_id>")
    sub.add_parser("report", help="render a run directory as HTML or JSON", add_help=False)
    localize_cli.add_parser(sub)
    return parser


def _plan(args: argparse.Namespace, console: Console) -> int:
    spec = load_experiment_file(args.file)
    prepared = prepare(
        spec, output_root=args.output_root, allow_smoke_operators=True, device=spec.scenario.device
    )
    publish_plan(prepared)
    console.print(plan_table(prepared.execution))
    console.print(f"wrote {prepared.store.path / 'plan.jsonl'}")
    return EXIT_OK


def _run(args: argparse.Namespace, console: Console) -> int:
    spec = load_experiment_file(args.file)
    check_case_timeout(args.case_timeout)
    adapter = instantiate_runtime(runtime_config(args.runtime))
    prepared = prepare(
        spec,
        output_root=args.output_root,
        allow_smoke_operators=args.allow_smoke_operators,
        device=adapter.device,
    )
    with case_progress(console, len(prepared.execution.cases)) as on_case:
        summary = run_prepared(
            prepared,
            adapter,
            resume=not args.no_resume,
            on_case=on_case,
            case_timeout_s=args.case_timeout,
        )
    console.print(verdict_table(summary))
    print_reasons(console, summary.records)
    if args.localize:
        localize_cli.localize_failing(summary, adapter, console)
    report_after_run(summary.experiment_dir, console)
    return exit_code(summary.records)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["report"]:
        from xconf.report.cli import main_report

        return main_report(argv[1:])
    args = _parser().parse_args(argv)
    console = make_console()
    try:
        if args.command == "plan":
            return _plan(args, console)
        if args.command == "verify":
            from xconf.verify import main_verify

            return main_verify(args.run_dir, console)
        if args.command == "localize":
            return localize_cli.run(args, console)
        return _run(args, console)
    except XconfError as error:
        report_error(error)
        return EXIT_INVALID


if __name__ == "__main__":
    sys.exit(main())
