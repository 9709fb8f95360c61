"""Charts of released answers with their intervals as error bars, as inline SVG (matplotlib).

Post-processing of released values only. Figures are built with matplotlib's object API (no
pyplot state, no display backend) and written as SVG with glyphs as paths, so the report needs
no font or script.
"""

from __future__ import annotations

import io
import math
import re
from typing import Any

from matplotlib import rc_context
from matplotlib.backends.backend_svg import FigureCanvasSVG
from matplotlib.figure import Figure

from dpsql.engine.results import QueryResult

__all__ = ["chart_svg"]

_BAR = "#4878a8"
_MAX_BARS = 60


def chart_svg(result: QueryResult, kind: str, title: str) -> str | None:
    """An SVG chart of ``result``'s noisy columns (one panel each) with ``confidence`` intervals
    as error bars: bars (``kind="bar"``) or points (``"dot"``); None for ``"none"`` or an answer
    with no rows or no numeric column."""
    noisy = [c for c in result.columns if c in result.intervals]
    if kind == "none" or not noisy or not result.rows:
        return None
    groups = [c for c in result.columns if c not in result.intervals]
    rows = result.rows[:_MAX_BARS]
    at = [result.columns.index(g) for g in groups]
    labels = [" / ".join(str(row[i]) for i in at) or "all rows" for row in rows]
    figure = Figure(figsize=(min(11.0, 2.2 + 0.45 * len(rows)), 2.6 * len(noisy)), dpi=96)
    FigureCanvasSVG(figure)
    axes = figure.subplots(len(noisy), 1, squeeze=False)[:, 0]
    for ax, column in zip(axes, noisy, strict=True):
        index = result.columns.index(column)
        values = [_number(row[index]) for row in rows]
        pairs = result.intervals[column][: len(rows)]
        low = [v - _number(p[0], v) for v, p in zip(values, pairs, strict=True)]
        high = [_number(p[1], v) - v for v, p in zip(values, pairs, strict=True)]
        positions = list(range(len(rows)))
        error = [[max(0.0, x) for x in low], [max(0.0, x) for x in high]]
        if kind == "bar":
            ax.bar(positions, values, color=_BAR, yerr=error, capsize=3, ecolor="#222")
        else:
            ax.errorbar(positions, values, yerr=error, fmt="o", color=_BAR, ecolor="#222",
                        capsize=3)
        ax.set_xticks(positions, labels, rotation=45 if len(rows) > 6 else 0, ha="right"
                      if len(rows) > 6 else "center", fontsize=8)
        ax.set_ylabel(column, fontsize=9)
        ax.axhline(0, color="#999", linewidth=0.6)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_title(f"{title} ({result.confidence:.0%} intervals)", fontsize=10)
    figure.tight_layout()
    buffer = io.StringIO()
    # Ids inside each SVG are salted by the chart's title: several charts inline in one page
    # must not share clip-path or glyph ids.
    with rc_context({"svg.hashsalt": title}):
        figure.savefig(buffer, format="svg", metadata={"Date": None})
    svg = buffer.getvalue()
    svg = re.sub(r"^.*?(<svg)", r"\1", svg, count=1, flags=re.S)  # no XML prologue inline
    return re.sub(r"<metadata>.*?</metadata>", "", svg, count=1, flags=re.S)


def _number(value: Any, default: float = 0.0) -> float:
    if value is None:
        return default
    number = float(value)
    return number if math.isfinite(number) else default
