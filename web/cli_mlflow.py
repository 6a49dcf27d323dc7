"""``triloop train mlflow-export RUN``: a run's series into MLflow tracking, for those who
watch their experiments there.

The run and its metrics are read through the web API with the engineer's token (so the
export is refused exactly what ``train show`` would be), then written with MLflow's own
client to any tracking URI it takes: a file store (``file:./mlruns``, the default; MLflow 3
refuses it unless asked, and naming it is asking), a database (``sqlite:///mlflow.db``) or
a tracking server. One MLflow run per triloop run, found again by its ``triloop.run_id``
tag: exporting again adds only the iterations after the last one exported, so it can be
repeated while a run trains; ``--all`` (with ``--submitted-by``) exports every run the API
lists. MLflow comes with the optional ``tracking`` extra.

What goes where: every number of each iteration (``reward_mean``, ``kl``, ...; the free-form
``extra_metrics`` too) is a metric at ``step`` = the iteration, timed when the iteration was
recorded; the RUN.yaml config, flattened to dotted keys, the run's params; its id, name,
submitter, status and base checkpoint, tags. A run that ended ends its MLflow run
(completed: FINISHED, failed: FAILED, cancelled: KILLED).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any
from urllib.parse import urlencode

import typer

from triloop.cli_output import OutputFormat, OutputOption, echo, fail, print_json
from web.cli_api import DEFAULT_API, ApiOption, TokenOption, api_call, quoted, resolve_id

mlflow_app = typer.Typer(help="Export runs to MLflow tracking.", no_args_is_help=True)

RUN_ID_TAG = "triloop.run_id"
EXPORTED_THROUGH_TAG = "triloop.exported_through_iteration"
# The fields of a metric point that are not numbers of the iteration.
_NOT_SERIES = frozenset({"iteration", "alarms", "checkpoint_id", "created_at", "extra_metrics"})
# MLflow accepts letters, digits, _ - . / space and : in a key (``_validate_metric_name``).
_KEY_REFUSED = re.compile(r"[^\w\-./ :]")
_MAX_KEY_CHARS = 250
_MAX_PARAM_CHARS = 6000  # MLflow's limit on a param's value
_BATCH = 1000  # metrics per log_batch call (MLflow's limit)
# A finished triloop run ends its MLflow run with this status.
_END_STATUS = {"completed": "FINISHED", "failed": "FAILED", "cancelled": "KILLED"}
_ALLOW_FILE_STORE = "MLFLOW_ALLOW_FILE_STORE"


@dataclass(frozen=True)
class SeriesPoint:
    """One number of one iteration, as MLflow logs it."""

    key: str
    value: float
    timestamp_ms: int
    step: int


@dataclass(frozen=True)
class ExportResult:
    """What an export wrote: the MLflow run, how many values, and through which iteration."""

    mlflow_run_id: str
    experiment_id: str
    created: bool
    values_logged: int
    through_iteration: int | None
    ended_as: str | None


def metric_key(name: str) -> str:
    """A triloop series name as an MLflow metric or param key (refused characters -> ``_``)."""
    return _KEY_REFUSED.sub("_", name)[:_MAX_KEY_CHARS]


def series_of(points: Sequence[Mapping[str, Any]], *, after: int | None = None
              ) -> list[SeriesPoint]:
    """Every number of every iteration after ``after``, in iteration order (pure)."""
    out: list[SeriesPoint] = []
    for point in sorted(points, key=lambda p: int(p["iteration"])):
        step = int(point["iteration"])
        if after is not None and step <= after:
            continue
        at = int(datetime.fromisoformat(str(point["created_at"])).timestamp() * 1000)
        numbers = {k: v for k, v in point.items() if k not in _NOT_SERIES}
        numbers.update(point.get("extra_metrics") or {})
        for name, value in sorted(numbers.items()):
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue  # absent (None) this iteration
            out.append(SeriesPoint(metric_key(name), float(value), at, step))
    return out


def flat_params(config: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, str]]:
    """The RUN.yaml config as (dotted key, text value) pairs; lists as JSON (pure)."""
    for name, value in config.items():
        key = f"{prefix}{name}"
        if isinstance(value, Mapping) and value:
            yield from flat_params(value, prefix=f"{key}.")
            continue
        text = value if isinstance(value, str) else json.dumps(value, sort_keys=True,
                                                                default=str)
        yield metric_key(key), text[:_MAX_PARAM_CHARS]


def export_run(run: Mapping[str, Any], points: Sequence[Mapping[str, Any]], *,
               tracking_uri: str, experiment: str) -> ExportResult:
    """Write one triloop run (``GET /api/runs/{id}``) and its metric points to MLflow."""
    with _file_store_allowed(tracking_uri):
        return _export(run, points, tracking_uri=tracking_uri, experiment=experiment)


@contextmanager
def _file_store_allowed(tracking_uri: str) -> Iterator[None]:
    """MLflow 3 keeps its file store in maintenance mode and refuses it unless asked: a
    ``file:`` URI (or a bare path) is asking, so say yes for this export only."""
    if "://" in tracking_uri and not tracking_uri.startswith("file:"):
        yield
        return
    before = os.environ.get(_ALLOW_FILE_STORE)
    os.environ[_ALLOW_FILE_STORE] = "true"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(_ALLOW_FILE_STORE, None)
        else:
            os.environ[_ALLOW_FILE_STORE] = before


def _export(run: Mapping[str, Any], points: Sequence[Mapping[str, Any]], *,
            tracking_uri: str, experiment: str) -> ExportResult:
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    found = client.get_experiment_by_name(experiment)
    experiment_id = (found.experiment_id if found is not None
                     else client.create_experiment(experiment))
    existing = client.search_runs([experiment_id],
                                  filter_string=f"tags.`{RUN_ID_TAG}` = '{run['id']}'",
                                  max_results=1)
    tags = {RUN_ID_TAG: str(run["id"]), "triloop.run_name": str(run.get("name") or ""),
            "triloop.submitted_by": str(run.get("submitted_by") or ""),
            "triloop.status": str(run.get("status") or ""),
            "triloop.base_checkpoint_id": str(run.get("base_checkpoint_id") or "")}
    if existing:
        mlflow_run = existing[0]
        exported = mlflow_run.data.tags.get(EXPORTED_THROUGH_TAG)
        after = int(exported) if exported not in (None, "") else None
        params: list[Any] = []  # logged once: MLflow refuses a param changed later
    else:
        mlflow_run = client.create_run(experiment_id, tags={"mlflow.runName": str(
            run.get("name") or run["id"])})
        after = None
        params = [Param(k, v) for k, v in flat_params(run.get("config") or {})]
    run_id = mlflow_run.info.run_id
    series = series_of(points, after=after)
    through = max((p.step for p in series), default=after)
    if through is not None:
        tags[EXPORTED_THROUGH_TAG] = str(through)
    metrics = [Metric(p.key, p.value, p.timestamp_ms, p.step) for p in series]
    client.log_batch(run_id, params=params[:100], tags=[RunTag(k, v) for k, v in tags.items()])
    for start in range(100, len(params), 100):  # MLflow takes 100 params per batch
        client.log_batch(run_id, params=params[start:start + 100])
    for start in range(0, len(metrics), _BATCH):
        client.log_batch(run_id, metrics=metrics[start:start + _BATCH])
    ended_as = _END_STATUS.get(str(run.get("status")))
    if ended_as is not None:
        client.set_terminated(run_id, status=ended_as)
    return ExportResult(run_id, experiment_id, created=not existing, values_logged=len(metrics),
                        through_iteration=through, ended_as=ended_as)


@mlflow_app.command("mlflow-export")
def train_mlflow_export(
    run_ref: Annotated[str | None, typer.Argument(
        help="Run id, or a unique prefix of it; leave out with --all.")] = None,
    every_run: Annotated[bool, typer.Option(
        "--all", help="Export every run the API lists (with --submitted-by: that person's).")
    ] = False,
    submitted_by: Annotated[str | None, typer.Option(
        "--submitted-by", help="With --all: only this person's runs.")] = None,
    tracking_uri: Annotated[str, typer.Option(
        "--tracking-uri", envvar="MLFLOW_TRACKING_URI",
        help="Where MLflow tracks: a file store (file:./mlruns), a database "
             "(sqlite:///mlflow.db) or a tracking server URL.")] = "file:./mlruns",
    experiment: Annotated[str, typer.Option(
        "--experiment", help="MLflow experiment to export into (made if absent).")
    ] = "triloop",
    output: OutputOption = OutputFormat.table, token: TokenOption = None,
    api_url: ApiOption = DEFAULT_API,
) -> None:
    """Export a run's series (one metric per number, step = iteration) to MLflow tracking;
    again later, only the new iterations."""
    if (run_ref is None) == (not every_run):
        fail("name one run (RUN, an id or a unique prefix) or pass --all, not both", code=2)
    if submitted_by is not None and not every_run:
        fail("--submitted-by selects runs for --all; with one RUN leave it out", code=2)
    try:
        from mlflow.exceptions import MlflowException
    except ImportError:
        fail("MLflow export needs the mlflow package: pip install 'triloop[tracking]' "
             "(or mlflow-skinny)")
    run_ids = ([resolve_id("runs", run_ref, "training run", token=token, api_url=api_url)]
               if run_ref is not None else
               _listed_runs(submitted_by, token=token, api_url=api_url))
    results = []
    for run_id in run_ids:
        run = api_call("GET", f"/api/runs/{quoted(run_id)}", token=token, api_url=api_url)
        metrics = api_call("GET", f"/api/runs/{quoted(run_id)}/metrics", token=token,
                           api_url=api_url)
        try:
            result = export_run(run, metrics["metrics"], tracking_uri=tracking_uri,
                                experiment=experiment)
        except MlflowException as refused:  # a URI it cannot track to, a store it refuses
            fail(f"MLflow could not take run {run_id} at {tracking_uri}: "
                 f"{str(refused).splitlines()[0]}")
        results.append({"run_id": run_id, "tracking_uri": tracking_uri,
                        "experiment": experiment, **result.__dict__})
        if output is not OutputFormat.json:
            echo(_sentence(run_id, result, experiment=experiment, tracking_uri=tracking_uri))
    if output is OutputFormat.json:
        print_json(results[0] if run_ref is not None else results)
    elif not run_ids:
        echo("no run to export")


def _listed_runs(submitted_by: str | None, *, token: str | None, api_url: str) -> list[str]:
    """Every run the API lists to this person (all pages), oldest first."""
    ids: list[str] = []
    cursor: str | None = None
    while True:
        query = {"limit": 200, **({"submitted_by": submitted_by} if submitted_by else {}),
                 **({"cursor": cursor} if cursor else {})}
        page = api_call("GET", f"/api/runs?{urlencode(query)}", token=token, api_url=api_url)
        ids.extend(item["id"] for item in page["items"])
        cursor = page.get("next_cursor")
        if not cursor:
            return ids[::-1]


def _sentence(run_id: str, result: ExportResult, *, experiment: str, tracking_uri: str) -> str:
    through = ("no iteration yet" if result.through_iteration is None
               else f"through iteration {result.through_iteration}")
    return (f"{'exported' if result.created else 'updated'} run {run_id} to MLflow run "
            f"{result.mlflow_run_id} (experiment {experiment!r} at {tracking_uri}): "
            f"{result.values_logged} values, {through}"
            + (f"; ended as {result.ended_as}" if result.ended_as else ""))
