"""The rows that say who asked for each rollout batch (``rollout_batch``).

Execution's Nexus handler records a batch when it admits a loop's request; the requester
is the loop the Temporal server named. The database refuses a trajectory outside such a
batch, or one that is not what its batch was asked for, so evidence cannot be slipped
into a batch governance will count. A training batch also records its tasks; the database
refuses one on a held-out task (a frozen eval set's, or production traffic's).
"""

from __future__ import annotations

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlmodel import Session

from triloop.held_out import Conflict, held_out_conflicts
from triloop.models import RolloutBatch
from triloop.workflow_api import RolloutBatchInput


class BatchConflict(ValueError):
    """A batch the database will not record: its id was already requested for something
    else (another requester or checkpoint), or it trains on a held-out task."""


def record_requested_batch(*, engine: Engine, batch: RolloutBatchInput, requested_by: str) -> None:
    """Insert the batch's row; the same request again is a no-op, a different one refused."""
    wanted = (batch.purpose, batch.checkpoint_id, batch.run_id, requested_by)
    with Session(engine) as session:
        existing = session.get(RolloutBatch, batch.batch_id)
        if existing is None:
            session.add(RolloutBatch(id=batch.batch_id, purpose=batch.purpose,
                                     checkpoint_id=batch.checkpoint_id, run_id=batch.run_id,
                                     requested_by=requested_by, task_ids=batch_tasks(batch)))
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
        assert existing is not None
        stored = (existing.purpose, existing.checkpoint_id, existing.run_id,
                  existing.requested_by)
        if stored != wanted:
            raise BatchConflict(
                f"batch {batch.batch_id} was already requested by {existing.requested_by} "
                f"({existing.purpose}, checkpoint {existing.checkpoint_id}); "
                f"refusing {requested_by}'s request ({batch.purpose}, "
                f"checkpoint {batch.checkpoint_id})")


def batch_tasks(batch: RolloutBatchInput) -> list[str]:
    """Every task the batch asks to play: its items' and its continued episodes'."""
    return sorted({item.task_id for item in batch.items}
                  | {episode.task_id for episode in batch.continue_episodes})


def training_conflicts(*, engine: Engine, batch: RolloutBatchInput) -> list[Conflict]:
    """The batch's tasks that are held out (eval sets, production traffic), read from
    PostgreSQL for the policy to decide on."""
    with Session(engine) as session:
        return held_out_conflicts(session, batch_tasks(batch))
