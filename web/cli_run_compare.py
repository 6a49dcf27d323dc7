"""``triloop train compare A B [C ...]``: runs side by side, as ``/runs/compare`` shows them.

Three tables: the runs (each named by the label the console's legend uses), the RUN.yaml
settings whose values differ (one column per run), and each run's last value of the main
series. ``--output json`` prints the API's comparison whole, series included.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Annotated, Any
from urllib.parse import urlencode

import typer

from triloop.cli_output import Column, OutputFormat, OutputOption, echo, print_json, print_rows
from web.cli_api import DEFAULT_API, ApiOption, TokenOption, api_call, resolve_id
from web.cli_run_progress import number_text, share_text

# The series the last-value table shows, in the order a reader looks for them.
SERIES = (("reward (mean)", "reward_mean"), ("success rate", "success/rate"),
          ("entropy", "entropy"), ("KL", "kl"), ("gradient norm", "grad_norm"),
          ("loss", "loss"))

RunsArgument = Annotated[list[str], typer.Argument(
    help="Two to eight runs: ids, or unique prefixes of them.")]


def last_value(metrics: Sequence[dict[str, Any]], key: str) -> float | None:
    """The series' value at the last iteration that recorded it."""
    for point in reversed(metrics):
        value = point.get(key)
        if value is None:
            value = (point.get("extra_metrics") or {}).get(key)
        if value is not None:
            return float(value)
    return None


def _value_text(present: bool, value: Any) -> str:
    if not present:
        return "(not set)"
    return value if isinstance(value, str) else json.dumps(value)


def _setting_of(index: int) -> Callable[[dict[str, Any]], str]:
    return lambda row: _value_text(row["present"][index], row["values"][index])


def _value_of(index: int) -> Callable[[dict[str, Any]], str]:
    return lambda row: number_text(row["values"][index])


def print_comparison(comparison: dict[str, Any], output: OutputFormat) -> None:
    """The comparison's three tables (or the JSON as the API gave it)."""
    if output is OutputFormat.json:
        print_json(comparison)
        return
    runs = comparison["runs"]
    print_rows(runs, (
        Column("run", lambda r: r["label"]), Column("id", lambda r: r["id"], is_id=True),
        Column("status", lambda r: r["status"]),
        Column("iterations", lambda r: f"{r['iterations_done']} of {r['iterations']}"),
        Column("last reward", lambda r: number_text(r.get("last_reward"))),
        Column("last success", lambda r: share_text(r.get("last_success")))), output)
    differences = comparison["config_differences"]
    echo("")
    if differences:
        echo("RUN.yaml settings that differ:")
        print_rows(differences, (Column("setting", lambda d: d["path"]), *(
            Column(run["label"], _setting_of(i)) for i, run in enumerate(runs))), output)
    else:
        echo("Their RUN.yaml configs are the same.")
    echo("")
    echo("Last values:")
    rows = [{"series": title, "values": [last_value(r["metrics"], key) for r in runs]}
            for title, key in SERIES]
    rows = [row for row in rows if any(v is not None for v in row["values"])]
    print_rows(rows, (Column("series", lambda row: row["series"]), *(
        Column(run["label"], _value_of(i)) for i, run in enumerate(runs))), output)


def train_compare(
    run_refs: RunsArgument, output: OutputOption = OutputFormat.table,
    token: TokenOption = None, api_url: ApiOption = DEFAULT_API,
) -> None:
    """Compare runs: their labels, the RUN.yaml settings that differ, their last values; the
    console's /runs/compare?ids=... draws their series overlaid."""
    run_ids = [resolve_id("runs", ref, "training run", token=token, api_url=api_url)
               for ref in run_refs]
    query = urlencode({"ids": ",".join(run_ids)})
    comparison = api_call("GET", f"/api/runs/compare?{query}", token=token, api_url=api_url)
    print_comparison(comparison, output)
    if output is OutputFormat.table:
        echo("")
        echo(f"console: {api_url.rstrip('/')}/runs/compare?ids={','.join(run_ids)}")
