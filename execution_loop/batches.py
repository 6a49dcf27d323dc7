"""The rows that say who asked for each rollout batch (``rollout_batch``).

Execution's Nexus handler records a batch when it admits a loop's request; the requester
is the loop the Temporal server named. The database refuses a trajectory outside such a
batch, or one that is not what its batch was asked for, so evidence cannot be slipped
into a batch governance will count.
"""

from __future__ import annotations

from sqlalchemy import Engine
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session

from triloop.models import RolloutBatch
from triloop.workflow_api import RolloutBatchInput


class BatchConflict(ValueError):
    """A batch id already requested for something else (another requester or checkpoint)."""


def record_requested_batch(*, engine: Engine, batch: RolloutBatchInput, requested_by: str) -> None:
    """Insert the batch's row; the same request again is a no-op, a different one refused."""
    wanted = (batch.purpose, batch.checkpoint_id, batch.run_id, requested_by)
    with Session(engine) as session:
        existing = session.get(RolloutBatch, batch.batch_id)
        if existing is None:
            session.add(RolloutBatch(id=batch.batch_id, purpose=batch.purpose,
                                     checkpoint_id=batch.checkpoint_id, run_id=batch.run_id,
                                     requested_by=requested_by))
            try:
                session.commit()
                return
            except IntegrityError:  # a concurrent retry of the same request won the race
                session.rollback()
                existing = session.get(RolloutBatch, batch.batch_id)
        assert existing is not None
        stored = (existing.purpose, existing.checkpoint_id, existing.run_id,
                  existing.requested_by)
        if stored != wanted:
            raise BatchConflict(
                f"batch {batch.batch_id} was already requested by {existing.requested_by} "
                f"({existing.purpose}, checkpoint {existing.checkpoint_id}); "
                f"refusing {requested_by}'s request ({batch.purpose}, "
                f"checkpoint {batch.checkpoint_id})")
