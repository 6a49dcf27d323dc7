"""Training runs: listing (with each run's last reward and success), detail with
per-iteration metrics, alarms, progress and proposals, and submission rows."""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import func
from sqlalchemy.dialects.postgresql import distinct_on
from sqlmodel import Session, col, select

from triloop.models import Checkpoint, Task, TrainingRun, TrainingStep
from triloop.models._columns import utcnow
from triloop.statuses import FINISHED_RUN_STATUSES, RunStatus
from web.data.run_progress import (
    ProposedCandidate,
    RunProgress,
    proposed_candidates,
    run_progress,
    scheduled_iterations,
    timed_iterations,
)
from web.pagination import Page, keyset, page_of

TERMINAL_STATUSES = FINISHED_RUN_STATUSES
MAX_CHART_POINTS = 500


class RunSummary(BaseModel):
    """A training run as listed."""

    model_config = ConfigDict(from_attributes=True)
    id: str
    name: str
    submitted_by: str
    status: str
    status_reason: str | None = None
    iterations_done: int
    base_checkpoint_id: str | None = None
    environment_version_ids: list[str]
    workflow_id: str | None = None
    created_at: datetime
    updated_at: datetime | None = None


class MetricPoint(BaseModel):
    """One iteration's metrics and the alarms raised at it."""

    model_config = ConfigDict(from_attributes=True)
    iteration: int
    loss: float | None = None
    kl: float | None = None
    entropy: float | None = None
    reward_mean: float | None = None
    reward_variance: float | None = None
    within_group_reward_variance: float | None = None
    grad_norm: float | None = None
    discrimination: float | None = None
    trainable_tokens: int | None = None
    alarms: list[str]
    checkpoint_id: str | None = None
    created_at: datetime
    extra_metrics: dict[str, float] = Field(
        default_factory=dict,
        description="every other number the iteration recorded, by key (for example "
                    "reward/task/<task>, reward/env/<environment>, dynamic_sampling/drop_rate or "
                    "length/mean)")

    @classmethod
    def of(cls, step: TrainingStep) -> MetricPoint:
        """A training step with its free-form metrics and length statistics as numbers."""
        point = cls.model_validate(step)
        point.extra_metrics = numeric_metrics(step.metrics, step.length_stats)
        return point


def numeric_metrics(metrics: Mapping[str, Any] | None,
                    length_stats: Mapping[str, Any] | None) -> dict[str, float]:
    """The finite numbers among a step's metrics (and its length stats, as ``length/<k>``)."""
    found: dict[str, float] = {}
    keyed = (metrics or {}).get("series")  # the learner's keyed series (reward/task/<id>, ...)
    for prefix, values in (("", metrics or {}), ("", keyed if isinstance(keyed, Mapping) else {}),
                           ("length/", length_stats or {})):
        for key, value in values.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue
            if math.isfinite(value):
                found[f"{prefix}{key}"] = float(value)
    return found


class Alarm(BaseModel):
    """A stability alarm (echo trap, template collapse, ...) at an iteration."""

    iteration: int
    name: str


# The learner's per-tag keys (learning_loop.batch_metrics; web imports no loop).
TAG_REWARD_PREFIX = "reward/tag/"
TAG_SUCCESS_PREFIX = "success/tag/"


class TagResult(BaseModel):
    """Reward and success of one tag value's tasks, at the last iteration that had them."""

    tag: str  # key=value
    key: str
    value: str
    reward: float | None = None  # mean return of its episodes
    success: float | None = None  # share of its episodes the verdict called a success
    iteration: int  # the last iteration with episodes of its tasks


def tag_results(points: list[MetricPoint]) -> list[TagResult]:
    """Per tag value: the latest ``reward/tag/<k>=<v>`` and ``success/tag/<k>=<v>``."""
    latest: dict[str, dict[str, Any]] = {}
    for point in points:  # oldest first: later iterations overwrite
        for key, value in point.extra_metrics.items():
            for prefix, field_name in ((TAG_REWARD_PREFIX, "reward"),
                                       (TAG_SUCCESS_PREFIX, "success")):
                if key.startswith(prefix):
                    tag = key[len(prefix):]
                    row = latest.setdefault(tag, {})
                    if row.get("iteration") != point.iteration:  # a newer iteration: reset
                        row.clear()
                        row["iteration"] = point.iteration
                    row[field_name] = value
    results = []
    for tag, row in sorted(latest.items()):
        key, _, tag_value = tag.partition("=")
        results.append(TagResult(tag=tag, key=key, value=tag_value, **row))
    return results


class RunDetail(RunSummary):
    """A run with its config, metrics (latest 500 iterations), alarms and checkpoints."""

    config: dict[str, Any]
    metrics: list[MetricPoint]
    alarms: list[Alarm]
    checkpoint_ids: list[str]
    tags: list[TagResult] = Field(
        default_factory=list,
        description="reward and success per tag of the run's tasks (task.tags), at the last "
                    "iteration with episodes of each; the series are reward/tag/<k>=<v> and "
                    "success/tag/<k>=<v> in every metric point")
    progress: RunProgress
    proposed: list[ProposedCandidate] = Field(
        default_factory=list,
        description="the candidates the run proposed, oldest first, each with the promotion "
                    "governance opened for it")


class RunMetrics(BaseModel):
    """Metrics after an iteration, for live charts, with the run's progress."""

    run_id: str
    status: str
    status_reason: str | None = None
    iterations_done: int
    metrics: list[MetricPoint]
    progress: RunProgress
    proposed: list[ProposedCandidate] = Field(default_factory=list)


class RunListed(RunSummary):
    """A run as the runs list shows it: with its schedule's length and its last results."""

    iterations: int = Field(description="iterations its schedule asks for (N)")
    last_reward: float | None = Field(default=None, description="mean reward of its last "
                                                                "iteration")
    last_success: float | None = Field(default=None, description="success rate of its last "
                                                                 "iteration (share, 0..1)")


def list_runs(
    *, session: Session, limit: int, cursor: str | None, submitted_by: str | None = None,
    status: str | None = None, id_prefix: str | None = None,
) -> Page[RunListed]:
    """Runs, newest first, optionally of one submitter or status, or whose id starts so."""
    statement = select(TrainingRun)
    if id_prefix is not None:
        statement = statement.where(col(TrainingRun.id).startswith(id_prefix, autoescape=True))
    if submitted_by is not None:
        statement = statement.where(TrainingRun.submitted_by == submitted_by)
    if status is not None:
        statement = statement.where(TrainingRun.status == status)
    statement = keyset(statement, [col(TrainingRun.created_at), col(TrainingRun.id)], cursor,
                       (datetime, str), limit)
    rows = list(session.exec(statement))
    last = _last_results(session, [r.id for r in rows[:limit]])
    return page_of(rows, limit, lambda r: (r.created_at, r.id), lambda r: _listed(r, last))


def runs_listed(*, session: Session, run_ids: list[str]) -> dict[str, RunListed]:
    """These runs as the list shows them, by id (ids that name no run are left out)."""
    rows = list(session.exec(select(TrainingRun).where(col(TrainingRun.id).in_(run_ids))))
    last = _last_results(session, [r.id for r in rows])
    return {row.id: _listed(row, last) for row in rows}


def _listed(run: TrainingRun,
            last: Mapping[str, tuple[float | None, float | None]]) -> RunListed:
    reward, success = last.get(run.id, (None, None))
    return RunListed(**RunSummary.model_validate(run).model_dump(),
                     iterations=scheduled_iterations(run.config),
                     last_reward=reward, last_success=success)


# The learner's success-rate key (learning_loop.batch_metrics.SUCCESS_RATE; web imports no loop).
SUCCESS_RATE_KEY = "success/rate"


def _last_results(session: Session, run_ids: list[str]) -> dict[str, tuple[float | None,
                                                                           float | None]]:
    """Each run's last iteration's (mean reward, success rate), one query for the page."""
    if not run_ids:
        return {}
    rows = session.exec(
        select(TrainingStep.run_id, TrainingStep.reward_mean, TrainingStep.metrics)
        .where(col(TrainingStep.run_id).in_(run_ids))
        .ext(distinct_on(col(TrainingStep.run_id)))
        .order_by(col(TrainingStep.run_id), col(TrainingStep.iteration).desc()))
    found: dict[str, tuple[float | None, float | None]] = {}
    for run_id, reward, metrics in rows:
        success = numeric_metrics(metrics, None).get(SUCCESS_RATE_KEY)
        found[run_id] = (reward if reward is not None and math.isfinite(reward) else None,
                         success)
    return found


def progress_of(session: Session, run: TrainingRun, now: datetime | None = None) -> RunProgress:
    """The run's progress now (see web.data.run_progress)."""
    return run_progress(status=run.status, iterations_done=run.iterations_done,
                        config=run.config, created_at=run.created_at,
                        updated_at=run.updated_at,
                        timed=timed_iterations(session=session, run_id=run.id),
                        now=now or datetime.now(UTC))


def submitters(*, session: Session, limit: int = 200) -> list[str]:
    """The people who submitted runs, by name (the runs list's submitter filter)."""
    rows = session.exec(select(TrainingRun.submitted_by).distinct()
                        .order_by(col(TrainingRun.submitted_by)).limit(limit))
    return list(rows)


def get_run(*, session: Session, run_id: str) -> TrainingRun | None:
    """The run row, if any."""
    return session.get(TrainingRun, run_id)


def _points(session: Session, run_id: str, after: int | None) -> list[MetricPoint]:
    statement = select(TrainingStep).where(TrainingStep.run_id == run_id)
    if after is not None:
        statement = statement.where(col(TrainingStep.iteration) > after)
    statement = statement.order_by(col(TrainingStep.iteration).desc()).limit(MAX_CHART_POINTS)
    rows = list(session.exec(statement))
    return [MetricPoint.of(row) for row in reversed(rows)]


def run_detail(*, session: Session, run_id: str) -> RunDetail | None:
    """The run with metrics, alarms and the checkpoints it produced."""
    run = session.get(TrainingRun, run_id)
    if run is None:
        return None
    points = _points(session, run_id, None)
    checkpoints = session.exec(
        select(Checkpoint.id).where(Checkpoint.run_id == run_id)
        .order_by(col(Checkpoint.created_at))
    )
    return RunDetail(
        **RunSummary.model_validate(run).model_dump(),
        config=run.config,
        metrics=points,
        alarms=[Alarm(iteration=p.iteration, name=a) for p in points for a in p.alarms],
        checkpoint_ids=list(checkpoints),
        tags=tag_results(points),
        progress=progress_of(session, run),
        proposed=proposed_candidates(session=session, run_id=run_id),
    )


def run_metrics(*, session: Session, run_id: str, after: int | None) -> RunMetrics | None:
    """Metrics after an iteration (all when ``after`` is None)."""
    run = session.get(TrainingRun, run_id)
    if run is None:
        return None
    return RunMetrics(
        run_id=run.id, status=run.status, status_reason=run.status_reason,
        iterations_done=run.iterations_done, metrics=_points(session, run_id, after),
        progress=progress_of(session, run),
        proposed=proposed_candidates(session=session, run_id=run_id),
    )


def tasks_by_id(*, session: Session, task_ids: list[str]) -> dict[str, Task]:
    """The tasks among these ids that exist."""
    rows = session.exec(select(Task).where(col(Task.id).in_(task_ids)))
    return {task.id: task for task in rows}


def checkpoint_exists(*, session: Session, checkpoint_id: str) -> bool:
    """Whether a checkpoint with this id exists."""
    return session.get(Checkpoint, checkpoint_id) is not None


def insert_run(
    *, session: Session, run_id: str, name: str, submitted_by: str, config: dict[str, Any],
    base_checkpoint_id: str | None, environment_version_ids: list[str], workflow_id: str,
) -> TrainingRun:
    """The submitted run's row (the web role may insert it; learning updates its status)."""
    run = TrainingRun(
        id=run_id, name=name, submitted_by=submitted_by, config=config,
        base_checkpoint_id=base_checkpoint_id, environment_version_ids=environment_version_ids,
        workflow_id=workflow_id, status=RunStatus.submitted,
    )
    session.add(run)
    session.flush()
    return run


def mark_failed(*, session: Session, run_id: str, reason: str) -> None:
    """Record that a run could not be started."""
    run = session.get(TrainingRun, run_id)
    if run is not None:
        run.status, run.status_reason, run.updated_at = RunStatus.failed, reason, utcnow()
        session.add(run)


class RunAlarm(BaseModel):
    """An alarm with the run it belongs to, for the overview."""

    run_id: str
    run_name: str
    iteration: int
    names: list[str]
    created_at: datetime


def recent_alarms(*, session: Session, limit: int = 10) -> list[RunAlarm]:
    """The latest iterations that raised an alarm, across runs."""
    rows = session.exec(
        select(TrainingStep, TrainingRun.name)
        .join(TrainingRun, col(TrainingRun.id) == col(TrainingStep.run_id))
        .where(func.cardinality(col(TrainingStep.alarms)) > 0)
        .order_by(col(TrainingStep.created_at).desc()).limit(limit)
    )
    return [RunAlarm(run_id=step.run_id, run_name=name, iteration=step.iteration,
                     names=list(step.alarms), created_at=step.created_at) for step, name in rows]
