"""``xconf report RUN_DIR [-o report.html] [--format html|json]``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from xconf.errors import XconfError
from xconf.report.writer import FORMATS, default_output, render, report_file

EXIT_OK = 0
EXIT_USAGE = 2


def build_parser(prog: str = "xconf report") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description="Write the drift report of one run directory."
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="<output root>/<experiment_id>")
    parser.add_argument(
        "-o",
        "--output",
        default=None,
        help="output file ('-' for stdout); default RUN_DIR/report.<format>",
    )
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default=None,
        help="html (default, or from the -o suffix), json, or csv (one row per case)",
    )
    parser.add_argument(
        "--tokenizer",
        default=None,
        help="a local tokenizer directory (tokenizer.json) to show token text with",
    )
    parser.add_argument("--quiet", action="store_true", help="no terminal summary")
    return parser


def main_report(argv: list[str]) -> int:
    """Entry point for the ``report`` subcommand; returns the process exit code."""
    args = build_parser().parse_args(argv)
    suffix = Path(args.output).suffix.lstrip(".") if args.output else ""
    fmt = args.format or (suffix if suffix in ("json", "csv") else "html")
    to_stdout = args.output == "-"
    target = default_output(args.run_dir, fmt) if args.output is None else Path(args.output)
    try:
        from xconf.report.build import build_report

        if to_stdout:
            sys.stdout.write(render(build_report(args.run_dir, tokenizer=args.tokenizer), fmt))
            return EXIT_OK
        with report_file(target, args.run_dir) as write:  # opened before the run is read
            data = build_report(args.run_dir, tokenizer=args.tokenizer)
            write(render(data, fmt))
    except XconfError as exc:
        from xconf.shown_text import shown

        print(
            shown(
                f"xconf report: error [{exc.code}]"
                + (f" at '{exc.path}'" if exc.path else "")
                + f": {exc.message}"
            ),
            file=sys.stderr,
        )
        return EXIT_USAGE
    if not args.quiet:
        from xconf.report.terminal import render_terminal_summary
        from xconf.shown_text import console

        render_terminal_summary(data, console(stderr=True), target)
    return EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main_report(sys.argv[1:]))
