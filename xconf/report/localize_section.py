"""The report's "Drift by layer" section: one chart per localized case (``xconf localize``).

Reads the newest sealed localization of each case (``xconf.artifacts.localization.latest``) and
draws, per decoder layer, the rollout-vs-training relative difference of the attention
output, the MLP output and the residual stream, with the embeddings before the stack and
the final norm and logits after it; grey ticks mark where each tap would count as diverged
(``factor x floor``) and a red line marks the first divergence.
"""

from __future__ import annotations

import base64
import io
import math
from pathlib import Path
from typing import Any

from xconf.artifacts.localization import latest
from xconf.report import plots

SERIES = (("attention", "#4c78a8"), ("mlp", "#f58518"), ("residual", "#54a24b"))
EDGE_KINDS = {"embedding": -1, "final_norm": 0, "logits": 1}  # x offsets around the stack


def _x(row: dict[str, Any], layers: int) -> int:
    if row["layer"] is not None:
        return int(row["layer"])
    offset = EDGE_KINDS[row["kind"]]
    return -1 if offset < 0 else layers - 1 + offset + 1


def drift_figure(document: dict[str, Any]) -> plots.PlotImage:
    figure_cls, canvas_cls = plots.mpl()
    layers = int(document["num_layers"])
    rows = document["taps"]
    low_clip = float(document["min_floor"]) / 10
    fig = figure_cls(figsize=(8.0, 3.2))
    ax = fig.add_subplot(1, 1, 1)
    plots.style(ax)

    def y(value: float) -> float:
        return max(float(value), low_clip)

    for kind, colour in SERIES:
        points = [(int(r["layer"]), y(r["case_relative"])) for r in rows if r["kind"] == kind]
        ax.plot(*zip(*points, strict=True), marker="o", ms=3.5, color=colour, label=kind)
    for r in rows:
        if r["layer"] is None:
            ax.plot([_x(r, layers)], [y(r["case_relative"])], marker="s", color=plots.INK, ms=4)
    limits = [
        (_x(r, layers), y(float(document["factor"]) * max(r["floor"], document["min_floor"])))
        for r in rows
    ]
    xs, ys = zip(*limits, strict=True)
    ax.scatter(xs, ys, marker="_", s=60, color=plots.MUTED, label=f"{document['factor']:g}x floor")
    first = document.get("first_divergence")
    if first:
        ax.axvline(_x(first, layers), color=plots.THRESHOLD, linewidth=1.0, linestyle="--")
    values = [y(r["case_relative"]) for r in rows] + list(ys)
    plots.log_axis(ax, "y", min(values) / 2, max(values) * 2)
    ticks = [-1, *range(layers), layers, layers + 1]
    ax.set_xticks(ticks)
    ax.set_xticklabels(["emb", *map(str, range(layers)), "norm", "logits"])
    ax.set_xlabel("layer", fontsize=8, color=plots.MUTED)
    ax.set_ylabel("relative difference", fontsize=8, color=plots.MUTED)
    ax.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), fontsize=7.5, frameon=False, ncol=4)
    fig.tight_layout()
    alt = f"drift by layer for case {document['case_id']}: {document['line']}"
    canvas_cls(fig)
    buffer = io.BytesIO()
    fig.savefig(
        buffer, format="png", dpi=plots.DPI, facecolor="white", pil_kwargs=plots.PNG_OPTIONS
    )
    return plots.PlotImage(base64.b64encode(buffer.getvalue()).decode("ascii"), alt, None)


def localize_sections(run_dir: str | Path) -> list[dict[str, Any]]:
    """One entry per case with a sealed localization (or a recorded failure to localize
    it), in case-id order."""
    root = Path(run_dir) / "localize"
    if root.is_symlink() or not root.is_dir():
        return []
    out: list[dict[str, Any]] = []
    for case_dir in sorted(root.iterdir()):
        document = latest(Path(run_dir), case_dir.name)
        if document is None:
            continue
        if document.get("status") == "error":  # `--localize` recorded why it could not
            out.append(
                {
                    "case_id": str(document.get("case_id", case_dir.name)),
                    "changed": "",
                    "line": str(document.get("line", "localize failed")),
                    "image": None,
                    "first": None,
                }
            )
            continue
        finite = all(math.isfinite(float(r["case_relative"])) for r in document["taps"])
        out.append(
            {
                "case_id": document["case_id"],
                "changed": ", ".join(f"{k}={v}" for k, v in document["changed"].items())
                or "baseline",
                "line": document["line"],
                "image": drift_figure(document) if finite else None,
                "first": document.get("first_divergence"),
            }
        )
    return out
