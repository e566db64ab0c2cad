"""Line charts as inline SVG, drawn with plain Python (no JavaScript, no external files).

Example::

    from ckptstore.reports.svg import Series, line_chart

    svg = line_chart("loss", [Series("training", [(1, 0.9), (2, 0.5)])], x_label="steps")
    assert svg.startswith("<svg")
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from html import escape

#: Colours of successive series (training, validation, ...), readable on white.
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")


@dataclasses.dataclass
class Series:
    """One named line: ``points`` are ``(x, y)`` pairs; non-finite values are dropped."""

    name: str
    points: Sequence[tuple[float, float]]
    color: str | None = None
    #: Drawn dashed (a second line of the same colour, e.g. validation beside training).
    dashed: bool = False

    def finite_points(self) -> list[tuple[float, float]]:
        return sorted(
            (float(x), float(y)) for x, y in self.points if math.isfinite(x) and math.isfinite(y)
        )


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """About ``count`` round tick values covering ``[low, high]``."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return [0.0]
    if high <= low:
        return [low]
    raw = (high - low) / max(count, 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.ceil(low / step) * step
    ticks = []
    value = first
    while value <= high + step * 1e-9:
        ticks.append(round(value, 12))
        value += step
    return ticks or [low]


def format_tick(value: float) -> str:
    """Short label: ``1000`` -> ``1k``, ``0.000123`` -> ``1.23e-04``."""
    if value == 0:
        return "0"
    if abs(value) >= 1e4 and float(value).is_integer():
        return f"{value / 1000:g}k"
    if abs(value) < 1e-3 or abs(value) >= 1e6:
        return f"{value:.2e}"
    return f"{value:.4g}"


_DASH = ' stroke-dasharray="6,3"'


def _legend_entry(x: float, y: float, color: str, label: str, dash: str) -> str:
    return (
        f'<line x1="{x}" y1="{y - 4}" x2="{x + 18}" y2="{y - 4}" stroke="{color}" '
        f'stroke-width="2.5"{dash}/><text x="{x + 24}" y="{y}" font-size="11" '
        f'fill="#222">{escape(label)}</text>'
    )


@dataclasses.dataclass(frozen=True)
class _Frame:
    """The plot area and the data range drawn in it (padded so no point sits on the border)."""

    left: float
    top: float
    width: float
    height: float
    x_lo: float
    x_hi: float
    y_lo: float
    y_hi: float

    @staticmethod
    def around(
        points: Sequence[tuple[float, float]], left: float, top: float, width: float, height: float
    ) -> _Frame:
        xs = [p[0] for p in points]
        ys = [p[1] for p in points]
        x_lo, x_hi = min(xs), max(xs)
        y_lo, y_hi = min(ys), max(ys)
        if x_hi == x_lo:
            x_lo, x_hi = x_lo - 1, x_hi + 1
        pad = (abs(y_lo) * 0.1 or 1.0) if y_hi == y_lo else (y_hi - y_lo) * 0.05
        return _Frame(left, top, width, height, x_lo, x_hi, y_lo - pad, y_hi + pad)

    def sx(self, x: float) -> float:
        return self.left + (x - self.x_lo) / (self.x_hi - self.x_lo) * self.width

    def sy(self, y: float) -> float:
        return self.top + self.height - (y - self.y_lo) / (self.y_hi - self.y_lo) * self.height

    def axes(self, x_label: str, svg_height: float, log_y: bool) -> list[str]:
        """Grid lines, tick labels, the frame and the x label."""
        left, top, right, bottom = (
            self.left,
            self.top,
            self.left + self.width,
            self.top + self.height,
        )
        parts = []
        for tick in nice_ticks(self.y_lo, self.y_hi):
            y = self.sy(tick)
            parts.append(
                f'<line x1="{left}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}" stroke="#e5e5e5"/>'
            )
            parts.append(
                f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11" '
                f'fill="#444">{escape(format_tick(10**tick if log_y else tick))}</text>'
            )
        for tick in nice_ticks(self.x_lo, self.x_hi):
            x = self.sx(tick)
            parts.append(
                f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{bottom}" stroke="#f0f0f0"/>'
            )
            parts.append(
                f'<text x="{x:.1f}" y="{bottom + 16}" text-anchor="middle" font-size="11" '
                f'fill="#444">{escape(format_tick(tick))}</text>'
            )
        parts.append(
            f'<rect x="{left}" y="{top}" width="{self.width}" height="{self.height}" fill="none" '
            'stroke="#888"/>'
        )
        parts.append(
            f'<text x="{left + self.width / 2:.1f}" y="{svg_height - 8}" text-anchor="middle" '
            f'font-size="12" fill="#333">{escape(x_label)}</text>'
        )
        return parts

    def series(
        self,
        name: str,
        pts: Sequence[tuple[float, float]],
        color: str,
        dash: str,
        lines: bool,
        legend: bool,
        x_label: str,
        log_y: bool,
    ) -> list[str]:
        """One series: a polyline (``lines``) and point markers with their values as tooltips."""
        parts = []
        if lines:
            coords = " ".join(f"{self.sx(x):.1f},{self.sy(y):.1f}" for x, y in pts)
            tip = "" if legend else f"<title>{escape(name)}</title>"
            parts.append(
                f'<polyline class="series" data-series="{escape(name)}" points="{coords}" '
                f'fill="none" stroke="{color}" stroke-width="{2 if legend else 1.2}"{dash}>{tip}'
                "</polyline>"
            )
        x_name = "step" if lines else x_label
        if (len(pts) <= 60 and legend) or not lines:  # markers would bury hundreds of lines
            for x, y in pts:
                value = 10**y if log_y else y
                parts.append(
                    f'<circle cx="{self.sx(x):.1f}" cy="{self.sy(y):.1f}" r="2.5" fill="{color}">'
                    f"<title>{escape(name)}: {escape(x_name)} {format_tick(x)}, "
                    f"{value:.6g}</title></circle>"
                )
        return parts


def line_chart(
    title: str,
    series: Sequence[Series],
    *,
    x_label: str = "batches",
    width: int = 520,
    height: int = 280,
    log_y: bool = False,
    lines: bool = True,
    legend: bool = True,
) -> str:
    """An ``<svg>`` element with one ``<polyline>`` per series that has points, axes with
    round ticks, a legend and a title. Series without finite points are listed as "no data".

    ``log_y`` draws the y axis in powers of ten (values <= 0 are dropped); ``lines=False`` draws
    every point as a marker and no line (a scatter plot); ``legend=False`` leaves the legend
    out (charts of hundreds of series) and names each line in its tooltip instead."""
    left, right, top, bottom = 64, 16, 48, 46
    drawn = [(s, s.finite_points()) for s in series]
    if log_y:
        drawn = [(s, [(x, math.log10(y)) for x, y in pts if y > 0]) for s, pts in drawn]
    all_points = [p for _, pts in drawn for p in pts]
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}">',
        f"<title>{escape(title)}</title>",
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>',
        f'<text x="{width / 2:.1f}" y="20" text-anchor="middle" font-size="14" '
        f'font-weight="bold">{escape(title)}</text>',
    ]
    if not all_points:
        parts.append(
            f'<text x="{width / 2:.1f}" y="{height / 2:.1f}" text-anchor="middle" '
            'font-size="13" fill="#666">no data</text></svg>'
        )
        return "".join(parts)

    frame = _Frame.around(all_points, left, top, width - left - right, height - top - bottom)
    parts += frame.axes(x_label, height, log_y)
    # lines, markers and legend
    legend_x = float(left)
    for index, (item, pts) in enumerate(drawn):
        color = item.color or PALETTE[index % len(PALETTE)]
        label = item.name if pts else f"{item.name} (no data)"
        dash = _DASH if item.dashed else ""
        if legend:
            parts.append(_legend_entry(legend_x, top - 10, color, label, dash))
            legend_x += 34 + 7 * len(label)
        if pts:
            parts += frame.series(item.name, pts, color, dash, lines, legend, x_label, log_y)
    parts.append("</svg>")
    return "".join(parts)
