"""The plain CLI: `xconf plan`, `xconf run`, `xconf verify` and `xconf report`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from xconf import session
from xconf.cli.render import ConsoleView
from xconf.session import Outcome


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
    verify = sub.add_parser(
        "verify",
        help="recompute every seal and verdict of a run offline "
        "(exit 0 valid, 1 damaged, 2 bad RUN_DIR, 3 incomplete)",
    )
    verify.add_argument("run_dir", type=Path, help="<output root>/<experiment_id>")
    sub.add_parser("report", help="render a run directory as HTML or JSON", add_help=False)
    return parser


def _plan(args: argparse.Namespace, view: ConsoleView) -> Outcome:
    from xconf.config.strict import load_experiment_file

    spec = load_experiment_file(args.file)
    return session.plan(spec, output_root=args.output_root, view=view)


def _run(args: argparse.Namespace, view: ConsoleView) -> Outcome:
    from xconf.config.strict import load_experiment_file
    from xconf.runtime.deadline import check_case_timeout

    spec = load_experiment_file(args.file)
    check_case_timeout(args.case_timeout)
    return session.run(
        spec,
        session.runtime_config(args.runtime),
        output_root=args.output_root,
        allow_smoke_operators=args.allow_smoke_operators,
        resume=not args.no_resume,
        case_timeout_s=args.case_timeout,
        view=view,
    )


def _verify(args: argparse.Namespace, view: ConsoleView) -> Outcome:
    from xconf.verify import main_verify

    return Outcome(main_verify(args.run_dir, view.console))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["report"]:
        from xconf.report.cli import main_report

        return main_report(argv[1:])
    args = _parser().parse_args(argv)
    step = {"plan": _plan, "run": _run, "verify": _verify}[args.command]
    view = ConsoleView()
    return session.guarded(lambda: step(args, view)).exit_code


if __name__ == "__main__":
    sys.exit(main())
