"""Write a report file atomically (temporary file in the same directory, then rename)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xconf.report.build import build_report
from xconf.report.errors import ReportError
from xconf.report.model import ReportData
from xconf.report.tokens import DecoderFactory

FORMATS = ("html", "json", "csv")


@dataclass(frozen=True)
class WrittenReport:
    path: Path
    format: str
    data: ReportData


def render(data: ReportData, fmt: str) -> str:
    """The report as text in ``fmt`` (``html`` or ``json``)."""
    if fmt == "json":
        return json.dumps(data.to_json_dict(), indent=2, sort_keys=False, allow_nan=False) + "\n"
    if fmt == "csv":
        from xconf.report.csv_table import render_csv

        return render_csv(data)
    if fmt == "html":
        from xconf.report.html import render_html

        return render_html(data)
    raise ReportError("report.bad_format", f"unknown report format {fmt!r}", "format")


def default_output(run_dir: str | os.PathLike[str], fmt: str) -> Path:
    return Path(run_dir) / f"report.{fmt}"


@contextmanager
def report_file(
    path: Path, run_dir: str | os.PathLike[str] | None = None
) -> Iterator[Callable[[str], None]]:
    """Open the directory ``path`` goes into once, now, and yield the writer of its text.

    Open it before the run is read: the report is then linked in relative to that
    descriptor (``safe_io.publish_bytes``), so a directory swapped for a symlink while the
    report is built or written redirects nothing, and a symlink planted at ``report.html``
    is replaced, never written through. The run directory itself (the default output's
    directory) must be a real directory, as the loader requires; another output directory
    is the user's choice and is resolved once, following links. One that does not exist
    yet is created only when the text is written (nothing is written if the build fails).
    """
    from xconf.artifacts.safe_io import Dir, open_root, publish_bytes
    from xconf.errors import ArtifactError

    def failed(exc: ArtifactError) -> ReportError:
        return ReportError(
            "report.write_failed", f"cannot write the report: {exc.message}", str(path)
        )

    in_run_dir = run_dir is not None and path.parent == Path(run_dir)
    opened: Dir | None = None
    refused: ArtifactError | None = None
    try:
        opened = open_root(path.parent, create=False, follow=not in_run_dir)
    except ArtifactError as exc:
        # Missing (created at write time) or refused: the build reports a bad run dir
        # first, with its own code; the refusal stands if the build succeeds.
        refused = None if not path.parent.exists() and not in_run_dir else exc

    def write(text: str) -> None:
        if refused is not None:
            raise failed(refused)
        try:
            directory = opened or open_root(path.parent, create=True, follow=True)
            try:
                publish_bytes(directory, path.name, text.encode("utf-8"), replace=True)
            finally:
                if opened is None:
                    directory.close()
        except ArtifactError as exc:
            raise failed(exc) from None

    try:
        yield write
    finally:
        if opened is not None:
            opened.close()


def write_text(path: Path, text: str) -> None:
    """Replace ``path`` atomically with ``text`` (see :func:`report_file`)."""
    with report_file(path) as write:
        write(text)


def write_report(
    run_dir: str | os.PathLike[str],
    output_path: str | os.PathLike[str] | None = None,
    *,
    fmt: str | None = None,
    decoder_factory: DecoderFactory | None = None,
) -> WrittenReport:
    """Build the report of ``run_dir`` and write it; the default is ``RUN_DIR/report.html``.

    The format follows ``fmt``, else the output suffix (``.json`` → JSON), else HTML.
    """
    if fmt is None:
        fmt = "json" if output_path is not None and str(output_path).endswith(".json") else "html"
    if fmt not in FORMATS:
        raise ReportError("report.bad_format", f"unknown report format {fmt!r}", "format")
    path = Path(output_path) if output_path is not None else default_output(run_dir, fmt)
    with report_file(path, run_dir) as write:
        data = build_report(run_dir, decoder_factory=decoder_factory)
        write(render(data, fmt))
    return WrittenReport(path, fmt, data)


def report_after_run(
    run_dir: str | os.PathLike[str],
    console: Any,
    output_path: str | os.PathLike[str] | None = None,
    *,
    table: bool = False,
) -> WrittenReport | None:
    """Write ``RUN_DIR/report.html`` at the end of a run or sweep and point at it.

    A report that cannot be written never changes the run's outcome: the coded error is
    printed as a warning and ``None`` is returned. ``table=False`` prints only the
    counts, the knob that moves drift most and the report path (the run has already
    printed its own verdict table).
    """
    from xconf.errors import XconfError
    from xconf.report.terminal import render_terminal_summary

    try:
        written = write_report(run_dir, output_path)
    except XconfError as exc:
        from rich.text import Text

        console.print(
            Text.assemble(("report not written ", "yellow"), f"[{exc.code}] {exc.message}")
        )
        return None
    render_terminal_summary(written.data, console, written.path, table=table)
    return written
