"""Render :class:`ReportData` as one self-contained HTML page (jinja2, inline PNGs)."""

from __future__ import annotations

import base64
import hashlib
import json
import math
from importlib import resources
from typing import Any

from xconf.report import attribution, case_plots, plots
from xconf.report.errors import ReportError
from xconf.report.localize_section import localize_sections
from xconf.report.model import RESULTS, CaseReport, KnobRow, ReportData
from xconf.report.stats import percent, sci

TEMPLATE = "report.html.j2"
SCRIPT = "report.js"

RESULT_LABELS = {
    "pass": "pass",
    "fail": "fail",
    "zero_active_tokens": "zero active tokens",
    "invalid_artifact": "invalid artifact",
    "invalid_identity": "invalid identity",
    "error": "error",
    "not_run": "not run",
}


def _jinja() -> Any:
    try:
        import jinja2
    except ImportError as exc:  # pragma: no cover - dependency is declared
        raise ReportError(
            "report.missing_dependency", "jinja2 is needed for the HTML report"
        ) from exc
    return jinja2


def _resource(name: str) -> str:
    return (resources.files("xconf.report") / "templates" / name).read_text(encoding="utf-8")


def _script() -> tuple[Any, str]:
    """The page script and its CSP source: only this exact script may run on the page."""
    from markupsafe import Markup

    text = _resource(SCRIPT)
    digest = base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii")
    return Markup(text), f"sha256-{digest}"


def _sort_value(value: float | int | None) -> str:
    """A ``data-v`` attribute the page script sorts on (missing values sort lowest)."""
    if value is None:
        return "-1e308"
    if isinstance(value, float) and math.isnan(value):
        return "1e308"
    return repr(float(value))


def _show(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(", ", ": "))


def _shift(value: float | None) -> str:
    if value is None:
        return "—"
    if abs(value) < 0.005:
        return "×1.0"  # "same as baseline" is the effect interval's word (attribution.py)
    direction = "↑" if value > 0 else "↓"
    return (
        f"{direction} {abs(value):.1f} decades"
        if abs(value) >= 1
        else f"{direction} ×{10 ** abs(value):.2g}"
    )


def _notable(case: CaseReport) -> list[KnobRow]:
    """Materialization rows worth showing up front: the changed knobs, any status other
    than ``applied``, and any actual value that differs from the requested one."""
    changed = {path for path, _ in case.changed}
    return [
        row
        for row in case.materialization
        if row.path in changed
        or row.status != "applied"
        or (row.actual is not None and row.actual != row.requested)
    ]


def _case_context(case: CaseReport, renderer: case_plots.CaseFigureRenderer) -> dict[str, Any]:
    return {
        "case": case,
        "image": renderer.render(case),
        "notable": _notable(case),
        "numbers": case.result in ("pass", "fail", "zero_active_tokens"),
    }


def _finalize(value: Any) -> Any:
    """Every ``{{ }}`` value: run, runtime and model text with control and bidi characters
    escaped (``xconf.shown_text``); xconf's own markup (the page script) unchanged."""
    from markupsafe import Markup

    from xconf.shown_text import shown

    if isinstance(value, str) and not isinstance(value, Markup):
        return shown(value)
    return value


def render_html(data: ReportData) -> str:
    """The report page as a string; every image is an inline ``data:`` PNG."""
    jinja2 = _jinja()
    env = jinja2.Environment(
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=_finalize,
    )
    env.filters.update(
        sci=sci,
        percent=percent,
        sortv=_sort_value,
        show=_show,
        shift=_shift,
        effect=attribution.describe,
        more=attribution.more_drift,
    )
    template = env.from_string(_resource(TEMPLATE))
    script, script_hash = _script()
    baseline = data.baseline
    threshold = (
        baseline.threshold
        if baseline
        else next((c.threshold for c in data.cases if c.threshold is not None), None)
    )
    chips = [(r, RESULT_LABELS[r], data.counts.get(r, 0)) for r in RESULTS if data.counts.get(r)]
    # The headline's knob only: one whose interval tells it apart from the baseline.
    named = data.headline.most_drift if data.headline else None
    top = next((k for k in data.knob_ranking if k.knob == named), None) if named else None
    renderer = case_plots.CaseFigureRenderer(data.cases)
    return str(
        template.render(
            data=data,
            script=script,
            script_hash=script_hash,
            baseline=baseline,
            chips=chips,
            top=top,
            confidence=f"{attribution.CONFIDENCE:.0%}",
            resamples=attribution.RESAMPLES,
            seed=attribution.SEED,
            labels=RESULT_LABELS,
            cases=[_case_context(c, renderer) for c in data.cases],
            attribution_image=plots.attribution_figure(data.attribution, threshold),
            localize=localize_sections(data.run_dir),
            sealed=sum(1 for c in data.cases if c.seal_verified),
            attempt_total=sum(len(c.attempts) for c in data.cases),
            attempt_unverified=sum(
                1 for c in data.cases for a in c.attempts if not a.seal_verified
            ),
        )
    )
