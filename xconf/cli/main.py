"""The plain CLI: `xconf plan`, `xconf run`, `xconf verify`, `xconf report`, `xconf localize`,
`xconf fix`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

# Only argparse at module level: `xconf --help` answers before any of xconf's core is loaded.
if TYPE_CHECKING:
    from xconf.cli.render import ConsoleView
    from xconf.session import Outcome


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="xconf", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    plan = sub.add_parser(
        "plan",
        help="validate and expand an experiment; build no engine",
        usage="xconf plan FILE [--runtime NAME [[+]runtime.KEY=VALUE ...]] [--output-root DIR]",
        epilog="With --runtime, the runtime's options and the checkpoint's vocabulary and "
        "context are checked too (read from its options, no engine built).",
    )
    plan.add_argument("file", type=Path)
    plan.add_argument("--runtime", default=None, help="the runtime the plan is for, e.g. cpu-smoke")
    plan.add_argument("--output-root", default="outputs")
    run = sub.add_parser(
        "run",
        help="plan, score every case on both sides, judge, seal",
        usage="xconf run FILE --runtime NAME [options] [[+]runtime.KEY=VALUE ...]",
        epilog="Runtime options take Hydra's syntax: runtime.KEY=VALUE changes one, "
        "+runtime.KEY=VALUE adds one; an option the runtime does not take is an error (exit 2).",
    )
    run.add_argument("file", type=Path)
    run.add_argument("--runtime", required=True, help="runtime adapter, e.g. cpu-smoke")
    run.add_argument(
        "--allow-smoke-operators",
        action="store_true",
        help="register and authorize the smoke-only operators",
    )
    run.add_argument("--no-resume", action="store_true", help="score again even if sealed")
    run.add_argument(
        "--no-reuse-sides",
        action="store_true",
        help="score every side of every case, even one a case before it scored alike",
    )
    run.add_argument(
        "--verbose",
        action="store_true",
        help="show vLLM/transformers/torch output on the terminal (default: <run>/xconf.log)",
    )
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
    sub.add_parser("report", help="render a run directory as HTML, JSON or CSV", add_help=False)
    from xconf.cli import check_model, judge, make_checkpoint
    from xconf.cli import fix as fix_cli
    from xconf.cli import localize as localize_cli

    make_checkpoint.add_parser(sub)
    check_model.add_parser(sub)
    judge.add_parser(sub)
    localize_cli.add_parser(sub)
    fix_cli.add_parser(sub)
    return parser


def _plan(args: argparse.Namespace, view: ConsoleView) -> Outcome:
    from xconf import session
    from xconf.config.strict import load_experiment_file

    spec = load_experiment_file(args.file)
    if args.runtime is None:
        note = " (no --runtime: token ids and lengths not checked against a model)"
        return session.plan(spec, output_root=args.output_root, view=view, note=note)
    from xconf.runtime.loading import runtime_config

    runtime = runtime_config(args.runtime, args.overrides)
    return session.plan(spec, output_root=args.output_root, view=view, runtime=runtime)


def _run(args: argparse.Namespace, view: ConsoleView) -> Outcome:
    from xconf import session
    from xconf.cli.localize import after_verdict
    from xconf.config.strict import load_experiment_file
    from xconf.runtime.deadline import check_case_timeout
    from xconf.runtime.loading import runtime_config

    spec = load_experiment_file(args.file)
    options = session.RunOptions(
        output_root=args.output_root,
        allow_smoke_operators=args.allow_smoke_operators,
        resume=not args.no_resume,
        reuse_sides=not args.no_reuse_sides,
        case_timeout_s=check_case_timeout(args.case_timeout),
        verbose=args.verbose,
    )
    return session.run(
        spec,
        runtime_config(args.runtime, args.overrides),
        options,
        view=view,
        after_verdict=after_verdict(args.localize, view.localized, view.localize_failed),
    )


def _verify(args: argparse.Namespace, view: ConsoleView) -> Outcome:
    from xconf.session import Outcome
    from xconf.verify import main_verify

    return Outcome(main_verify(args.run_dir, view.console))


def _judge(args: argparse.Namespace, view: ConsoleView) -> Outcome:
    from xconf.cli import judge
    from xconf.session import Outcome

    return Outcome(judge.run(args, view.console))


def _make_checkpoint(args: argparse.Namespace, view: ConsoleView) -> Outcome:
    from xconf.cli import make_checkpoint
    from xconf.session import Outcome

    return Outcome(make_checkpoint.run(args, view.console))


def _check_model(args: argparse.Namespace, view: ConsoleView) -> Outcome:
    from xconf.cli import check_model
    from xconf.session import Outcome

    return Outcome(check_model.run(args, view.console))


def _localize(args: argparse.Namespace, view: ConsoleView) -> Outcome:
    from xconf.cli import localize as localize_cli

    return localize_cli.step(args, view)


def _fix(args: argparse.Namespace, view: ConsoleView) -> Outcome:
    from xconf.cli import fix as fix_cli

    return fix_cli.step(args, view)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["report"]:
        from xconf.report.cli import main_report

        return main_report(argv[1:])
    parser = _parser()
    # Runtime overrides (runtime.KEY=VALUE) may stand anywhere after `run` (or `plan --runtime`),
    # like Hydra's.
    args, extra = parser.parse_known_args(argv)
    takes_overrides = args.command == "run" or (args.command == "plan" and args.runtime is not None)
    if extra and (not takes_overrides or any(e.startswith("-") for e in extra)):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.overrides = extra
    from xconf import session
    from xconf.cli.render import ConsoleView

    step = {
        "plan": _plan,
        "run": _run,
        "verify": _verify,
        "judge": _judge,
        "make-checkpoint": _make_checkpoint,
        "check-model": _check_model,
        "localize": _localize,
        "fix": _fix,
    }[args.command]
    view = ConsoleView()
    return session.guarded(lambda: step(args, view)).exit_code


if __name__ == "__main__":
    sys.exit(main())
