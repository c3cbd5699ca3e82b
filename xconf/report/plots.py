"""Shared figure helpers and the attribution chart (base64 PNG, matplotlib's Agg canvas).

matplotlib is imported only lazily, through :func:`mpl`; pyplot is never used,
so no global figure state is touched and nothing opens a window.
"""

from __future__ import annotations

import base64
import io
import math
from dataclasses import dataclass
from typing import Any

from xconf.report.errors import ReportError
from xconf.report.model import AttributionRow

RESULT_COLOURS = {
    "pass": "#1f9d55",
    "fail": "#d64545",
    "zero_active_tokens": "#d99a1e",
    "invalid_artifact": "#8e5bd6",
    "invalid_identity": "#8e5bd6",
    "error": "#6b7280",
    "not_run": "#9ca3af",
}
INK = "#1f2937"
MUTED = "#6b7280"
GRID = "#e5e7eb"
BELOW = "#4c78a8"
THRESHOLD = "#d64545"
DPI = 100
PNG_OPTIONS = {"compress_level": 2}  # zlib level 6 (the default) is a third of the draw time
MAX_ATTRIBUTION_BARS = 40


@dataclass(frozen=True)
class PlotImage:
    """A PNG (base64) and what it shows, so the page can carry checkable markers."""

    png_base64: str
    alt: str
    threshold_line: float | None
    caption: str = ""  # text shown with the figure, as page text rather than pixels


def mpl() -> tuple[Any, Any]:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:  # pragma: no cover - dependency is declared
        raise ReportError(
            "report.missing_dependency", "matplotlib is needed for the HTML report"
        ) from exc
    return Figure, FigureCanvasAgg


def _decade_label(exponent: int) -> str:
    return "1" if exponent == 0 else f"1e{exponent}"


def log_axis(ax: Any, axis: str, low: float, high: float) -> None:
    """A log axis with explicit decade ticks and plain labels.

    matplotlib's automatic log ticks create dozens of minor ticks and mathtext labels
    per axis; on a 256-case sweep that alone costs minutes, so the ticks are fixed here.
    """
    from matplotlib.ticker import FixedLocator, NullLocator

    first = math.floor(math.log10(low))
    last = math.ceil(math.log10(high))
    step = max(1, math.ceil((last - first) / 7))
    exponents = list(range(first, last + 1, step))
    target = ax.xaxis if axis == "x" else ax.yaxis
    (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
    target.set_major_locator(FixedLocator([10.0**e for e in exponents]))
    target.set_minor_locator(NullLocator())
    (ax.set_xticklabels if axis == "x" else ax.set_yticklabels)(
        [_decade_label(e) for e in exponents]
    )
    (ax.set_xlim if axis == "x" else ax.set_ylim)(low, high)


def style(ax: Any) -> None:
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    for side in ("left", "bottom"):
        ax.spines[side].set_color(GRID)
    ax.tick_params(colors=MUTED, labelsize=8)
    ax.grid(True, color=GRID, linewidth=0.6)
    ax.set_axisbelow(True)


def _encode(fig: Any, canvas_cls: Any) -> str:
    canvas_cls(fig)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, facecolor="white", pil_kwargs=PNG_OPTIONS)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _legend_above(ax: Any, ncol: int) -> None:
    ax.legend(
        loc="lower right",
        bbox_to_anchor=(1.0, 1.0),
        ncol=ncol,
        fontsize=7.5,
        frameon=False,
        borderaxespad=0.3,
        handlelength=1.6,
    )


def attribution_figure(
    rows: tuple[AttributionRow, ...], threshold: float | None
) -> PlotImage | None:
    """Max |diff| per intervention beside the baseline's, on a log axis."""
    shown = [r for r in rows if r.max_abs_diff is not None and math.isfinite(r.max_abs_diff)]
    shown = shown[:MAX_ATTRIBUTION_BARS]
    if not shown:
        return None
    figure_cls, canvas_cls = mpl()
    height = 1.3 + 0.26 * len(shown)
    fig = figure_cls(figsize=(10.5, height))
    fig.subplots_adjust(left=0.34, right=0.97, bottom=0.75 / height, top=1 - 0.4 / height)
    ax = fig.subplots()
    floor = 1e-12
    values = [max(r.max_abs_diff or 0.0, floor) for r in shown]
    labels = [r.label if len(r.label) <= 48 else r.label[:45] + "…" for r in shown]
    ys = list(range(len(shown)))[::-1]
    ax.barh(ys, values, color=[RESULT_COLOURS.get(r.result, MUTED) for r in shown], height=0.62)
    ax.set_yticks(ys)
    ax.set_yticklabels(labels, fontsize=8, color=INK)
    own = [r.threshold if r.threshold else threshold for r in shown]
    candidates = [*values, *(t for t in own if t)]
    log_axis(ax, "x", min(candidates) / 3, max(candidates) * 3)
    base = shown[0].baseline_max_abs_diff
    if base is not None and math.isfinite(base):
        ax.axvline(max(base, floor), color=INK, linewidth=1.2, label=f"baseline {base:.3g}")
    # Each bar is judged at its own case's threshold (a bfloat16 case at 5e-2, not at the
    # float32 line), so each row gets its own marker.
    marked = [(y, t) for y, t in zip(ys, own, strict=True) if t]
    if marked:
        distinct = sorted({t for _, t in marked})
        ax.vlines(
            [t for _, t in marked],
            [y - 0.42 for y, _ in marked],
            [y + 0.42 for y, _ in marked],
            color=THRESHOLD,
            linestyle="--",
            linewidth=1.4,
            label="threshold " + ", ".join(f"{t:g}" for t in distinct),
        )
    _legend_above(ax, ncol=2)
    ax.set_xlabel("max |diff| (log scale)", fontsize=8, color=MUTED)
    style(ax)
    return PlotImage(
        _encode(fig, canvas_cls),
        "max |diff| per intervention vs baseline, each against its own threshold",
        threshold,
    )
