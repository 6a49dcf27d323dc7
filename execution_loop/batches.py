"""The rows that say who asked for each rollout batch (``rollout_batch``), and its plan.

Every requester records its own batch under its own database role before it asks:
governance its eval batches, the web service people's production traffic. Execution's
Nexus handler can only reference those rows (``check_requested_batch``); the one row it
writes is learning's training batch (``record_requested_batch``), the request its handler
alone received, from the caller the Temporal server proved. Each row names its planned
episodes (``triloop.episode_plan``): the database refuses a trajectory outside that plan,
so evidence cannot be slipped into a batch governance will count. A training batch also
records its tasks; the database refuses one on a held-out task (a frozen eval set's, or
production traffic's).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlmodel import Session

from triloop.episode_plan import batch_plan
from triloop.held_out import Conflict, held_out_conflicts
from triloop.models import RolloutBatch
from triloop.workflow_api import RolloutBatchInput

# The one requester whose batch rows execution writes itself: what its handler received.
RECORDED_HERE = "learning"


class BatchConflict(ValueError):
    """A batch the database will not record: its id was already requested for something
    else (another requester or checkpoint), or it trains on a held-out task."""


def _asked(row: RolloutBatch) -> tuple[Any, ...]:
    return (row.purpose, row.checkpoint_id, row.run_id, row.requested_by, row.planned_episodes)


def _wanted(batch: RolloutBatchInput, requested_by: str) -> tuple[Any, ...]:
    return (batch.purpose, batch.checkpoint_id, batch.run_id, requested_by, batch_plan(batch))


def _conflict(batch: RolloutBatchInput, stored: RolloutBatch | None, caller: str) -> BatchConflict:
    if stored is None:
        return BatchConflict(
            f"batch {batch.batch_id} has no rollout_batch row: {caller} records its own "
            "batch (with its planned episodes) before it asks for it")
    return BatchConflict(
        f"batch {batch.batch_id} was requested by {stored.requested_by} "
        f"({stored.purpose}, checkpoint {stored.checkpoint_id}, "
        f"{len(stored.planned_episodes or {})} planned episodes); refusing {caller}'s request "
        f"({batch.purpose}, checkpoint {batch.checkpoint_id}, "
        f"{len(batch_plan(batch))} planned episodes)")


def record_requested_batch(*, engine: Engine, batch: RolloutBatchInput, requested_by: str) -> None:
    """Insert learning's batch row; the same request again is a no-op, a different one refused."""
    with Session(engine) as session:
        existing = session.get(RolloutBatch, batch.batch_id)
        if existing is None:
            session.add(RolloutBatch(id=batch.batch_id, purpose=batch.purpose,
                                     checkpoint_id=batch.checkpoint_id, run_id=batch.run_id,
                                     requested_by=requested_by,
                                     planned_episodes=batch_plan(batch),
                                     task_ids=batch_tasks(batch)))
            try:
                session.commit()
                return
            except IntegrityError:  # a concurrent retry of the same request won the race
                session.rollback()
                existing = session.get(RolloutBatch, batch.batch_id)
            except DBAPIError as refused:  # a trigger's refusal (SQLSTATE 42501) is final
                if getattr(refused.orig, "sqlstate", None) != "42501":
                    raise
                raise BatchConflict(str(refused.orig)) from refused
        if existing is None or _asked(existing) != _wanted(batch, requested_by):
            raise _conflict(batch, existing, requested_by)


def check_requested_batch(*, engine: Engine, batch: RolloutBatchInput, requested_by: str) -> None:
    """The batch row the caller recorded itself says exactly what it now asks for.

    The row must be the caller's own (its role stamped ``recorded_by``), for this purpose,
    checkpoint, run and plan; otherwise the request is refused before any episode runs.
    """
    with Session(engine) as session:
        stored = session.get(RolloutBatch, batch.batch_id)
    if (stored is None or _asked(stored) != _wanted(batch, requested_by)
            or stored.recorded_by != f"triloop_{requested_by}"):
        raise _conflict(batch, stored, requested_by)


def vouch_for_batch(*, engine: Engine, batch: RolloutBatchInput, caller: str) -> None:
    """Record learning's batch, or check the row any other caller recorded for itself."""
    if caller == RECORDED_HERE:
        record_requested_batch(engine=engine, batch=batch, requested_by=caller)
    else:
        check_requested_batch(engine=engine, batch=batch, requested_by=caller)


def batch_tasks(batch: RolloutBatchInput) -> list[str]:
    """Every task the batch asks to play: its items' and its continued episodes'."""
    return sorted({item.task_id for item in batch.items}
                  | {episode.task_id for episode in batch.continue_episodes})


def training_conflicts(*, engine: Engine, batch: RolloutBatchInput) -> list[Conflict]:
    """The batch's tasks that are held out (eval sets, production traffic), read from
    PostgreSQL for the policy to decide on."""
    with Session(engine) as session:
        return held_out_conflicts(session, batch_tasks(batch))
