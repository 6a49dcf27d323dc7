"""What the run page charts: every metric key of the run's iterations (pure: numbers in,
chart specs out). The browser draws them with uPlot (``static/vendor/uplot``, served
from the repository), which gives hover values, axis ticks, smoothing and a second run
overlaid; ``static/charts.js`` reads the specs from the page.

Keys sharing the prefix ``reward/task/`` are overlaid in one chart, and so are those
sharing ``reward/env/``, ``success/task/``, ``success/env/``, ``reward/tag/`` or
``success/tag/`` (per tag ``key=value`` of the tasks); the success rate is charted
next to mean reward; every other key gets a chart of its own. Iterations that raised
a stability alarm are marked on every chart. Each chart also carries a one-line text
summary, for screen readers and for a browser without JavaScript.

``compare_chart_data`` is the same for several runs at once (``/runs/compare``): every
chart any of them has, each run drawn in its own colour (the palette has a colour for each
of the at most eight compared runs) and named in the legend by its label, never by an id.
Per-task lines name their task by a short id, so no legend carries a 32-character id.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

# The named columns of ``training_step``, in the order a reader looks for them.
NAMED: tuple[tuple[str, str, str], ...] = (
    ("reward_mean", "Reward (mean)", ""),
    # Not a column: the learner's series key, kept beside reward (learning_loop.batch_metrics).
    ("success/rate", "Success rate", "share of episodes"),
    ("entropy", "Entropy", "nats/token"),
    ("kl", "KL to reference", ""),
    ("grad_norm", "Gradient norm", ""),
    ("discrimination", "Discrimination", "retrieval accuracy"),
    ("loss", "Loss", ""),
    ("reward_variance", "Reward variance", ""),
    ("within_group_reward_variance", "Within-group reward variance", ""),
    ("trainable_tokens", "Trainable tokens", "tokens"),
)
NAMED_KEYS = {key: (title, unit) for key, title, unit in NAMED}
# One colour per compared run, told apart also in grey (static/charts.js draws with them).
PALETTE = ("#2456c7", "#b45309", "#1f7a4d", "#7c3aed", "#be185d", "#0e7490", "#4d7c0f",
           "#9a3412")
# Characters of a task id a legend shows (the full id is in the run's config).
SHORT_TASK = 8
# Prefixes whose keys share one chart, that chart's title and its unit.
OVERLAID: tuple[tuple[str, str, str], ...] = (
    ("reward/task/", "Reward per task", "reward"),
    ("reward/env/", "Reward per environment", "reward"),
    ("success/task/", "Success rate per task", "share of episodes"),
    ("success/env/", "Success rate per environment", "share of episodes"),
    ("reward/tag/", "Reward per tag", "reward"),
    ("success/tag/", "Success rate per tag", "share of episodes"),
)


@dataclass(frozen=True)
class Series:
    """One line: the column it reads and its legend label."""

    key: str
    label: str


@dataclass(frozen=True)
class Chart:
    """One chart: its title, unit, lines and a text summary."""

    id: str
    title: str
    unit: str
    series: list[Series]
    summary: str


@dataclass(frozen=True)
class ChartData:
    """Everything the page needs: the charts, the x axis, every column, the alarms."""

    charts: list[Chart]
    iterations: list[int]
    columns: dict[str, list[float | None]]
    alarms: list[int]
    last_iteration: int = -1
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON for the page's ``<script type="application/json">``."""
        return asdict(self)


def fmt(value: float) -> str:
    """A short, readable number."""
    if value == 0:
        return "0"
    if abs(value) >= 1000 or abs(value) < 0.001:
        return f"{value:.2e}"
    return f"{value:.4g}"


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def columns_of(points: Sequence[Mapping[str, Any]]) -> dict[str, list[float | None]]:
    """Every metric key with one value (or None) per iteration, keys with no value dropped."""
    keys: list[str] = [key for key, _, _ in NAMED]
    for point in points:
        for key in point.get("extra_metrics") or {}:
            if key not in keys:
                keys.append(key)
    columns: dict[str, list[float | None]] = {}
    for key in keys:
        # A named key is a column of the point, or (success/rate) one of its keyed metrics.
        values = [_number(p[key]) if key in p else
                  _number((p.get("extra_metrics") or {}).get(key)) for p in points]
        if any(v is not None for v in values):
            columns[key] = values
    return columns


def _summary(title: str, series: list[Series], columns: Mapping[str, list[float | None]],
             iterations: list[int], alarms: list[int]) -> str:
    parts = []
    for line in series:
        pairs = [(x, y) for x, y in zip(iterations, columns[line.key], strict=True)
                 if y is not None]
        if not pairs:
            continue
        ys = [y for _, y in pairs]
        last_x, last_y = pairs[-1]
        name = "" if len(series) == 1 else f"{line.label}: "
        parts.append(f"{name}{len(pairs)} iterations, last {fmt(last_y)} at iteration "
                     f"{last_x}, range {fmt(min(ys))} to {fmt(max(ys))}")
    shown = sorted(set(alarms) & set(iterations))
    tail = f"; alarms at iterations {', '.join(map(str, shown))}" if shown else ""
    return f"{title}: " + ("; ".join(parts) or "no values yet") + tail


def _line_label(prefix: str, name: str) -> str:
    # A task's line is named by a short id: the legend stays readable beside the chart.
    if prefix.endswith("/task/") and len(name) > SHORT_TASK:
        return f"task {name[:SHORT_TASK]}…"
    return name


def _chart_id(text: str) -> str:
    return "chart-" + "".join(c if c.isalnum() else "-" for c in text).strip("-")


def run_chart_data(points: Sequence[Mapping[str, Any]]) -> ChartData:
    """The charts of a run from its metric points (dicts with ``iteration``, oldest first)."""
    iterations = [int(p["iteration"]) for p in points]
    alarms = [int(p["iteration"]) for p in points if p.get("alarms")]
    columns = columns_of(points)
    charts: list[Chart] = []
    grouped: set[str] = set()
    for prefix, title, unit in OVERLAID:
        keys = sorted(k for k in columns if k.startswith(prefix))
        if keys:
            grouped.update(keys)
            series = [Series(k, _line_label(prefix, k.removeprefix(prefix))) for k in keys]
            charts.append(Chart(_chart_id(prefix), title, unit, series,
                                _summary(title, series, columns, iterations, alarms)))
    for key in columns:
        if key in grouped:
            continue
        title, unit = NAMED_KEYS.get(key, (key, ""))
        series = [Series(key, title)]
        charts.append(Chart(_chart_id(key), title, unit, series,
                            _summary(title + (f" ({unit})" if unit else ""), series, columns,
                                     iterations, alarms)))
    if not charts:
        title, unit = NAMED_KEYS["reward_mean"]
        charts.append(Chart(_chart_id("reward_mean"), title, unit,
                            [Series("reward_mean", title)], f"{title}: no values yet"))
        columns["reward_mean"] = [None] * len(iterations)
    return ChartData(charts=charts, iterations=iterations, columns=columns, alarms=alarms,
                     last_iteration=iterations[-1] if iterations else -1)


@dataclass(frozen=True)
class ComparedSeries:
    """One run's columns in a comparison, with its legend label and colour."""

    id: str
    label: str
    color: str
    iterations: list[int]
    columns: dict[str, list[float | None]]
    alarms: list[int]


@dataclass(frozen=True)
class CompareChartData:
    """Every chart any compared run has, and each run's columns (for static/charts.js)."""

    charts: list[Chart]
    runs: list[ComparedSeries]

    def to_json(self) -> dict[str, Any]:
        """Plain JSON for the page's ``<script type="application/json">``."""
        return asdict(self)


def _compare_summary(chart: Chart, runs: Sequence[ComparedSeries]) -> str:
    parts = []
    for run in runs:
        for line in chart.series:
            values = [(x, y) for x, y in zip(run.iterations, run.columns.get(line.key, []),
                                             strict=False) if y is not None]
            if values:
                name = run.label if len(chart.series) == 1 else f"{run.label} {line.label}"
                parts.append(f"{name}: last {fmt(values[-1][1])} at iteration {values[-1][0]}")
    return f"{chart.title}: " + ("; ".join(parts) or "no values yet")


def compare_chart_data(
    runs: Sequence[tuple[str, str, Sequence[Mapping[str, Any]]]],
) -> CompareChartData:
    """Charts of several runs from (id, label, metric points) each, in the order given."""
    compared, charts, seen = [], [], set()
    for index, (run_id, label, points) in enumerate(runs):
        data = run_chart_data(points)
        compared.append(ComparedSeries(run_id, label, PALETTE[index % len(PALETTE)],
                                       data.iterations, data.columns, data.alarms))
        for chart in data.charts:
            if chart.id not in seen:
                seen.add(chart.id)
                charts.append(chart)
            else:  # a grouped chart (per task, ...) gets the lines every run has
                at = next(i for i, c in enumerate(charts) if c.id == chart.id)
                known = {line.key for line in charts[at].series}
                extra = [line for line in chart.series if line.key not in known]
                if extra:
                    charts[at] = Chart(chart.id, chart.title, chart.unit,
                                       charts[at].series + extra, chart.summary)
    charts = [Chart(c.id, c.title, c.unit, c.series, _compare_summary(c, compared))
              for c in charts]
    return CompareChartData(charts=charts, runs=compared)
