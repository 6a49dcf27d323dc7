"""Line charts as inline SVG, rendered on the server (pure: numbers in, markup out).

One chart per metric; iterations with a stability alarm get a marked vertical
line so a reader sees where the echo trap or template collapse was raised.
Each chart carries a text summary for screen readers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

WIDTH, HEIGHT = 520, 210
PAD_LEFT, PAD_RIGHT, PAD_TOP, PAD_BOTTOM = 64, 14, 14, 32


@dataclass(frozen=True)
class ChartSpec:
    """Which metric a chart shows and how to label it."""

    key: str
    title: str
    unit: str = ""


CHARTS: tuple[ChartSpec, ...] = (
    ChartSpec("reward_mean", "Reward (mean)"),
    ChartSpec("entropy", "Entropy", "nats/token"),
    ChartSpec("kl", "KL to reference"),
    ChartSpec("grad_norm", "Gradient norm"),
    ChartSpec("discrimination", "Discrimination", "retrieval accuracy"),
)


def fmt(value: float) -> str:
    """A short, readable number."""
    if value == 0:
        return "0"
    if abs(value) >= 1000 or abs(value) < 0.001:
        return f"{value:.2e}"
    return f"{value:.4g}"


def line_chart(
    spec: ChartSpec, points: Sequence[tuple[int, float | None]], alarms: Sequence[int]
) -> str:
    """An accessible SVG line chart of ``(iteration, value)`` with alarm markers."""
    finite = [(x, y) for x, y in points if y is not None and math.isfinite(y)]
    raw_label = spec.title + (f" ({spec.unit})" if spec.unit else "")
    label = escape(raw_label)
    chart_id = f"chart-{escape(spec.key)}"
    if not finite:
        summary = f"{raw_label}: no values yet"
        body = (f'<text x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle" '
                f'class="chart-empty">no values yet</text>')
        return _svg(chart_id, label, summary, body)
    xs = [x for x, _ in finite]
    ys = [y for _, y in finite]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    if x0 == x1:
        x0, x1 = x0 - 1, x1 + 1
    if y0 == y1:
        pad = abs(y0) * 0.1 or 1.0
        y0, y1 = y0 - pad, y1 + pad

    def sx(x: float) -> float:
        return PAD_LEFT + (x - x0) / (x1 - x0) * (WIDTH - PAD_LEFT - PAD_RIGHT)

    def sy(y: float) -> float:
        return PAD_TOP + (y1 - y) / (y1 - y0) * (HEIGHT - PAD_TOP - PAD_BOTTOM)

    path = " ".join(f"{'M' if i == 0 else 'L'}{sx(x):.1f},{sy(y):.1f}"
                    for i, (x, y) in enumerate(finite))
    parts = [
        f'<line class="axis" x1="{PAD_LEFT}" y1="{HEIGHT - PAD_BOTTOM}" '
        f'x2="{WIDTH - PAD_RIGHT}" y2="{HEIGHT - PAD_BOTTOM}"/>',
        f'<line class="axis" x1="{PAD_LEFT}" y1="{PAD_TOP}" x2="{PAD_LEFT}" '
        f'y2="{HEIGHT - PAD_BOTTOM}"/>',
        f'<text class="tick" x="{PAD_LEFT - 6}" y="{PAD_TOP + 4}" text-anchor="end">'
        f"{fmt(y1)}</text>",
        f'<text class="tick" x="{PAD_LEFT - 6}" y="{HEIGHT - PAD_BOTTOM}" text-anchor="end">'
        f"{fmt(y0)}</text>",
        f'<text class="tick" x="{PAD_LEFT}" y="{HEIGHT - 10}" text-anchor="start">it {x0}</text>',
        f'<text class="tick" x="{WIDTH - PAD_RIGHT}" y="{HEIGHT - 10}" text-anchor="end">'
        f"it {x1}</text>",
    ]
    marked = sorted({a for a in alarms if x0 <= a <= x1})
    for alarm in marked:
        x = sx(alarm)
        parts.append(f'<line class="alarm" x1="{x:.1f}" y1="{PAD_TOP}" x2="{x:.1f}" '
                     f'y2="{HEIGHT - PAD_BOTTOM}"><title>alarm at iteration {alarm}</title></line>')
    parts.append(f'<path class="series" d="{path}"/>')
    if len(finite) <= 60:
        parts += [f'<circle class="dot" cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5">'
                  f"<title>iteration {x}: {fmt(y)}</title></circle>" for x, y in finite]
    last_x, last_y = finite[-1]
    summary = (f"{raw_label}: {len(finite)} iterations, last {fmt(last_y)} at iteration {last_x}, "
               f"range {fmt(min(ys))} to {fmt(max(ys))}"
               + (f"; alarms at iterations {', '.join(map(str, marked))}" if marked else ""))
    return _svg(chart_id, label, summary, "".join(parts))


def _svg(chart_id: str, label: str, summary: str, body: str) -> str:
    return (
        f'<figure class="chart" aria-labelledby="{chart_id}-t">'
        f'<figcaption id="{chart_id}-t">{label}</figcaption>'
        f'<svg viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(summary)}" '
        f'preserveAspectRatio="xMidYMid meet">{body}</svg>'
        f'<p class="visually-hidden">{escape(summary)}</p></figure>'
    )


def run_charts(metrics: Sequence[dict[str, object]]) -> list[str]:
    """One chart per metric in ``CHARTS`` from metric points (dicts with ``iteration``)."""
    alarms = [int(str(m["iteration"])) for m in metrics if m.get("alarms")]
    charts = []
    for spec in CHARTS:
        points: list[tuple[int, float | None]] = []
        for m in metrics:
            value = m.get(spec.key)
            points.append((int(str(m["iteration"])),
                           float(value) if isinstance(value, int | float) else None))
        charts.append(line_chart(spec, points, alarms))
    return charts
