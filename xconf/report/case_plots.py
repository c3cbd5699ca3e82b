"""Per-case figures: |diff| histogram (log x, threshold line) beside the drift profile.

All cases of a report share the same axes, which makes them comparable at a glance and
lets one figure serve every case: the static parts (axes, ticks, labels) are drawn
once, and per case only the data artists are blitted onto that background and encoded.
Building and fully redrawing a figure per case is what made a 256-case report slow. The
per-case text (active count, threshold, tokens above it) is the figure's caption, page
text: drawing two text artists per case cost as much as the data artists and the PNG.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Sequence
from typing import Any

from xconf.report.model import CaseReport, Histogram
from xconf.report.plots import (
    BELOW,
    DPI,
    INK,
    MUTED,
    THRESHOLD,
    PlotImage,
    log_axis,
    mpl,
    style,
)


def _ranges(cases: Sequence[CaseReport]) -> tuple[tuple[float, float], float, tuple, int]:
    """Shared histogram x range, histogram y top (share), profile y range, last position."""
    lows, highs, shares, values, last = [], [], [0.1], [], 1
    for case in cases:
        hist = case.histogram
        if hist is not None:
            lows.append(hist.edges[0])
            highs.append(hist.edges[-1])
            total = sum(hist.counts) + hist.zero_count
            if total:
                shares.append(max(hist.counts, default=0) / total)
        for point in case.drift_profile:
            last = max(last, point.position)
            values += [v for v in (point.max_abs_diff, point.mean_abs_diff) if v and v > 0]
        if case.threshold and case.threshold > 0:
            values.append(case.threshold)
    x_range = (min(lows, default=1e-8), max(highs, default=1.0))
    y_range = (min(values, default=1e-8) / 3, max(values, default=1.0) * 3)
    return x_range, min(1.0, max(shares) * 1.1), y_range, last


class CaseFigureRenderer:
    """Render :class:`CaseReport` figures on shared axes (see the module docstring)."""

    def __init__(self, cases: Sequence[CaseReport]) -> None:
        figure_cls, canvas_cls = mpl()
        x_range, share_top, y_range, last = _ranges(cases)
        fig = figure_cls(figsize=(10.5, 2.9), dpi=DPI, facecolor="white")
        fig.subplots_adjust(left=0.07, right=0.985, bottom=0.2, top=0.86, wspace=0.22)
        self.canvas = canvas_cls(fig)
        self.fig = fig
        h, p = fig.subplots(1, 2)
        self.ax_hist, self.ax_prof = h, p
        log_axis(h, "x", *x_range)
        h.set_ylim(0, share_top)
        h.yaxis.set_major_formatter(_percent_formatter())
        h.set_xlabel("|training − rollout| logprob (log scale)", fontsize=8, color=MUTED)
        h.set_ylabel("share of active tokens", fontsize=8, color=MUTED)
        log_axis(p, "y", *y_range)
        self.y_floor = y_range[0]
        p.set_xlim(-0.5, last + 0.5)
        p.set_xlabel("token position (|diff| = 0 drawn on the floor)", fontsize=8, color=MUTED)
        p.set_title("drift by token position", fontsize=9, color=INK, loc="left")
        for ax in (h, p):
            style(ax)
        self.below = h.stairs([0.0], [1.0, 2.0], fill=True, color=BELOW, alpha=0.85)
        self.above = h.stairs([0.0], [1.0, 2.0], fill=True, color=THRESHOLD, alpha=0.85)
        self.vline = h.axvline(1.0, color=THRESHOLD, linestyle="--", linewidth=1.6)
        self.hist_empty = h.text(
            0.5,
            0.5,
            "no active tokens",
            ha="center",
            va="center",
            color=MUTED,
            transform=h.transAxes,
        )
        (self.max_line,) = p.plot(
            [],
            [],
            color=THRESHOLD,
            linewidth=1.3,
            marker="o",
            markersize=2.5,
            label="max |diff|",
        )
        (self.mean_line,) = p.plot(
            [], [], color=BELOW, linewidth=1.3, marker="o", markersize=2.5, label="mean |diff|"
        )
        self.hline = p.axhline(
            1.0, color=THRESHOLD, linestyle="--", linewidth=1.0, alpha=0.7, label="threshold"
        )
        p.legend(
            loc="lower right",
            bbox_to_anchor=(1.0, 1.0),
            ncol=3,
            fontsize=7.5,
            frameon=False,
            borderaxespad=0.3,
            handlelength=1.6,
        )
        self.prof_empty = p.text(
            0.5,
            0.5,
            "no active positions",
            ha="center",
            va="center",
            color=MUTED,
            transform=p.transAxes,
        )
        self.dynamic: tuple[Any, ...] = (
            self.below,
            self.above,
            self.vline,
            self.hist_empty,
            self.max_line,
            self.mean_line,
            self.hline,
            self.prof_empty,
        )
        for artist in self.dynamic:
            artist.set_animated(True)
        self.canvas.draw()
        self.background = self.canvas.copy_from_bbox(fig.bbox)

    def render(self, case: CaseReport) -> PlotImage | None:
        hist = case.histogram
        if hist is None and not any(q.active for q in case.drift_profile):
            return None  # nothing to draw: no active token
        threshold = hist.threshold_line if hist else case.threshold
        caption = self._histogram(hist)
        self._profile(case, threshold)
        self.canvas.restore_region(self.background)
        for artist in self.dynamic:
            if artist.get_visible():
                self.fig.draw_artist(artist)
        alt = f"|diff| histogram and drift profile of {case.case_id}"
        return PlotImage(self._png(), alt, threshold, caption)

    def _png(self) -> str:
        import numpy as np

        from xconf.report.png import encode_rgb

        rgba = np.asarray(self.canvas.buffer_rgba())
        return base64.b64encode(encode_rgb(rgba[:, :, :3])).decode("ascii")

    def _histogram(self, hist: Histogram | None) -> str:
        """Sets the histogram's artists; returns the caption."""
        shown = hist is not None
        for artist in (self.below, self.above, self.vline):
            artist.set_visible(shown)
        self.hist_empty.set_visible(not shown)
        if hist is None:
            return ""
        total = sum(hist.counts) + hist.zero_count
        shares = [c / total for c in hist.counts] if total else list(hist.counts)
        edges = list(hist.edges)
        over = [left >= hist.threshold_line for left in edges[:-1]]
        self.below.set_data([0 if o else s for s, o in zip(shares, over, strict=True)], edges)
        self.above.set_data([s if o else 0 for s, o in zip(shares, over, strict=True)], edges)
        self.vline.set_xdata([hist.threshold_line, hist.threshold_line])
        zeros = f", {hist.zero_count} exactly 0" if hist.zero_count else ""
        return (
            f"|diff| · {total} active{zeros} — "
            f"threshold {hist.threshold_line:g} · {hist.above_threshold} above"
        )

    def _profile(self, case: CaseReport, threshold: float | None) -> None:
        points = [q for q in case.drift_profile if q.active and q.max_abs_diff is not None]
        self.prof_empty.set_visible(not points)
        xs = [q.position for q in points]
        floor = self.y_floor
        self.max_line.set_data(xs, [_floored(q.max_abs_diff, floor) for q in points])
        self.mean_line.set_data(xs, [_floored(q.mean_abs_diff, floor) for q in points])
        self.hline.set_visible(bool(threshold))
        if threshold:
            self.hline.set_ydata([threshold, threshold])


def _floored(value: float | None, floor: float) -> float:
    """An exact 0 (bitwise-equal sides) has no place on a log axis: it is drawn on the
    axis floor so the line stays whole; a missing value stays a gap."""
    if value is None or math.isnan(value):
        return math.nan
    return value if value > floor else floor


def _percent_formatter() -> Any:
    from matplotlib.ticker import PercentFormatter

    return PercentFormatter(xmax=1.0, decimals=0)
