"""`xconf localize RUN_DIR CASE_ID` and the `--localize` step after a run.

Heavy imports (torch, the engines) are deferred to the call: `xconf --help` stays light.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # only argparse at module level: `xconf --help` imports this module
    from rich.console import Console
    from rich.table import Table

    from xconf.session import Outcome

FAILING = ("fail",)  # results whose drift localize explains (errors have no activations)


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "localize",
        help="score a case's frozen tokens again with taps on every module and report the "
        "first layer whose drift rises above the baseline's noise floor",
    )
    parser.add_argument("run_dir", type=Path, help="<output root>/<experiment_id>")
    parser.add_argument("case_id", help="a case id from plan.jsonl (the verdict table shows it)")
    parser.add_argument(
        "--runtime",
        default=None,
        help="runtime config (conf/runtime/NAME.yaml); default: the one the run used",
    )


def drift_table(document: dict[str, Any]) -> Table:
    from rich.table import Table
    from rich.text import Text

    table = Table(
        title=f"drift by tap: case {document['case_id']} vs baseline floor "
        f"(diverges above {document['factor']:g}x floor)"
    )
    for column in ("tap", "relative diff", "floor", "x floor", ""):
        table.add_column(column, justify="left" if column == "tap" else "right")
    for row in document["taps"]:
        mark = Text("above", style="bold red") if row["above"] else Text("")
        table.add_row(
            row["label"],
            f"{row['case_relative']:.3g}",
            f"{row['floor']:.3g}",
            f"{row['ratio']:.3g}",
            mark,
        )
    return table


def localize_one(
    run_dir: Path, case_id: str, console: Console, adapter: Any = None, runtime: str | None = None
) -> Any:
    from xconf.localize.replay import runtime_for
    from xconf.localize.service import localize_case

    if adapter is None and runtime is not None:
        adapter = runtime_for(runtime)
    result = localize_case(run_dir, case_id, adapter=adapter)
    console.print(drift_table(result.document))
    console.print(f"wrote {result.path}")
    console.print(result.line, markup=False, highlight=False)
    return result


def step(args: argparse.Namespace, view: Any) -> Outcome:
    """`xconf localize`: one session step (coded errors become exit 2 in ``session.guarded``)."""
    from xconf.session import EXIT_OK, Outcome

    localize_one(args.run_dir, args.case_id, view.console, runtime=args.runtime)
    return Outcome(EXIT_OK)


def localize_failing(summary: Any, adapter: Any, console: Console) -> None:
    """After a run: localize every failing case with the run's adapter; a case that cannot
    be localized is reported with its coded error and the others still run."""
    from xconf.errors import XconfError
    from xconf.session import report_error

    failing = [r for r in summary.records if r.result in FAILING]
    if not failing:
        console.print("localize: no failing case")
        return
    for record in failing:
        try:
            localize_one(Path(summary.experiment_dir), record.case_id, console, adapter)
        except XconfError as error:
            report_error(error)
