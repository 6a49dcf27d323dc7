"""The learning loop's rows: checkpoints (the lineage graph), training steps, proposals, runs.

Data access only, as the ``triloop_learning`` role; callers ask ``authorize()`` first.
Keyword-only functions over an engine, each one transaction.

Lineage invariants kept here:
- a base model is a root checkpoint (no parent, no run); every checkpoint a run writes
  names its parent, the run, the root (``base_model``), the environment versions and the
  rollout batches it learned from (``data``); every checkpoint records the hashes of the
  tokenizer, model config and chat template it is served with;
- an iteration is stored at most once: its ``training_step`` row (primary key run,
  iteration), its checkpoint row, the run's ``iterations_done`` and its alarm audit events
  are written in one transaction under a per-iteration advisory lock, so a retried or
  duplicated update cannot apply an iteration twice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine, func, text, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from triloop.audit import append_event
from triloop.db import session_scope
from triloop.models import Checkpoint, Proposal, Task, TrainingRun, TrainingStep

_ITERATION_LOCK = text("SELECT pg_advisory_xact_lock(hashtext(:key))")


def get_checkpoint(*, engine: Engine, checkpoint_id: str) -> Checkpoint | None:
    """A checkpoint row by id."""
    with Session(engine) as session:
        return session.get(Checkpoint, checkpoint_id)


def insert_checkpoint(*, session: Session, checkpoint: Checkpoint) -> bool:
    """Insert unless a row with that id exists (same weights); True if inserted."""
    values = checkpoint.model_dump()
    values.pop("created_at", None)
    result = session.execute(
        insert(Checkpoint).values(**values).on_conflict_do_nothing(index_elements=["id"])
    )
    return bool(getattr(result, "rowcount", 0))


@dataclass(frozen=True)
class BaseFacts:
    """What a root checkpoint records about the model it holds (migration 0024's columns)."""

    source_kind: str | None = None  # huggingface | gguf
    parameter_count: int | None = None
    source_dtype: str | None = None  # at the source: float32, bfloat16, q4_1 ...
    dtype: str | None = None  # as stored
    name: str | None = None  # an import's unique name; None for a RUN.yaml's directory


class CheckpointNameTaken(ValueError):
    """Another checkpoint already has the name an import asked for."""


def register_root(
    *, engine: Engine, checkpoint_id: str, artifact_uri: str, source: str,
    serving: Mapping[str, str | None] | None = None, facts: BaseFacts | None = None,
) -> bool:
    """The base model as a root checkpoint (no parent, no run); True if newly inserted.

    ``serving``: the tokenizer, model-config and chat-template hashes (column names).
    ``CheckpointNameTaken`` when ``facts.name`` belongs to another checkpoint.
    """
    hashes, facts = dict(serving or {}), facts or BaseFacts()
    root = Checkpoint(
        id=checkpoint_id, parent_id=None, run_id=None, base_model=checkpoint_id, iteration=0,
        environment_version_ids=[], data={"source": source}, artifact_uri=artifact_uri,
        created_by="learning", tokenizer_sha256=hashes.get("tokenizer_sha256"),
        model_config_sha256=hashes.get("model_config_sha256"),
        chat_template_sha256=hashes.get("chat_template_sha256"), **asdict(facts),
    )
    try:
        with session_scope(engine) as session:
            return insert_checkpoint(session=session, checkpoint=root)
    except IntegrityError as exc:
        if facts.name is not None and "ix_checkpoint_name" in str(exc.orig):
            raise CheckpointNameTaken(f"a checkpoint is already named {facts.name!r}") from exc
        raise


def checkpoint_named(*, engine: Engine, name: str) -> Checkpoint | None:
    """The checkpoint with this name, if any."""
    with Session(engine) as session:
        return session.exec(select(Checkpoint).where(Checkpoint.name == name)).first()


def get_training_step(*, engine: Engine, run_id: str, iteration: int) -> TrainingStep | None:
    """The stored iteration, if any."""
    with Session(engine) as session:
        return session.get(TrainingStep, (run_id, iteration))


def stability_rows(*, engine: Engine, run_id: str, before: int) -> list[dict[str, Any]]:
    """``metrics`` of the run's iterations before ``before``, oldest first."""
    with Session(engine) as session:
        rows = session.exec(
            select(TrainingStep.metrics)
            .where(TrainingStep.run_id == run_id)
            .where(col(TrainingStep.iteration) < before)
            .order_by(col(TrainingStep.iteration))
        )
        return [dict(m) for m in rows]


def record_iteration(
    *,
    engine: Engine,
    step: TrainingStep,
    checkpoint: Checkpoint | None,
    alarm_events: Sequence[Mapping[str, Any]] = (),
) -> bool:
    """Store an iteration exactly once; False (and nothing written) if it was already stored."""
    with session_scope(engine) as session:
        session.execute(_ITERATION_LOCK, {"key": f"training_step:{step.run_id}:{step.iteration}"})
        if session.get(TrainingStep, (step.run_id, step.iteration)) is not None:
            return False
        if checkpoint is not None:
            insert_checkpoint(session=session, checkpoint=checkpoint)
        session.add(step)
        session.flush()
        session.execute(
            update(TrainingRun)
            .where(col(TrainingRun.id) == step.run_id)
            .where(col(TrainingRun.iterations_done) < step.iteration)
            .values(iterations_done=step.iteration, updated_at=datetime.now(UTC))
        )
        for event in alarm_events:  # audited in the same transaction: once per iteration
            append_event(session, **event)
    return True


def get_run(*, engine: Engine, run_id: str) -> TrainingRun | None:
    """A training run row."""
    with Session(engine) as session:
        return session.get(TrainingRun, run_id)


def set_run_status(
    *, engine: Engine, run_id: str, status: str, reason: str | None
) -> None:
    """Record a run's status and why (the learning role may change only these columns)."""
    with session_scope(engine) as session:
        session.execute(
            update(TrainingRun).where(col(TrainingRun.id) == run_id)
            .values(status=status, status_reason=reason, updated_at=datetime.now(UTC))
        )


def get_tasks(*, engine: Engine, task_ids: Sequence[str]) -> dict[str, Task]:
    """Task rows by id (missing ids are absent)."""
    with Session(engine) as session:
        rows = session.exec(select(Task).where(col(Task.id).in_(list(task_ids))))
        return {t.id: t for t in rows}


def insert_proposal(*, engine: Engine, proposal: Proposal) -> bool:
    """Insert a proposal unless one with that id exists; True if inserted."""
    values = proposal.model_dump()
    values.pop("created_at", None)
    with session_scope(engine) as session:
        result = session.execute(
            insert(Proposal).values(**values).on_conflict_do_nothing(index_elements=["id"])
        )
        return bool(getattr(result, "rowcount", 0))


def reward_history(*, engine: Engine, run_id: str) -> list[tuple[int, float | None]]:
    """(iteration, reward_mean) of every stored iteration of a run, in order."""
    with Session(engine) as session:
        rows = session.exec(
            select(TrainingStep.iteration, TrainingStep.reward_mean)
            .where(TrainingStep.run_id == run_id).order_by(col(TrainingStep.iteration))
        )
        return [(int(i), r) for i, r in rows]


def recorded_alarms(*, engine: Engine, run_id: str, up_to: int) -> list[tuple[int, str]]:
    """(iteration, alarm kind) of every stability alarm a run stored up to an iteration."""
    with Session(engine) as session:
        rows = session.exec(
            select(TrainingStep.iteration, TrainingStep.alarms)
            .where(TrainingStep.run_id == run_id).where(col(TrainingStep.iteration) <= up_to)
            .order_by(col(TrainingStep.iteration))
        )
        return [(int(i), str(kind)) for i, kinds in rows for kind in kinds or []]


def lineage(*, engine: Engine, checkpoint_id: str, limit: int = 100_000) -> list[Checkpoint]:
    """The chain from the root to ``checkpoint_id`` (root first)."""
    chain: list[Checkpoint] = []
    with Session(engine) as session:
        current: str | None = checkpoint_id
        while current is not None and len(chain) < limit:
            row = session.get(Checkpoint, current)
            if row is None:
                raise LookupError(f"checkpoint {current!r} is missing from the lineage")
            chain.append(row)
            current = row.parent_id
    return chain[::-1]


def run_checkpoint_count(*, engine: Engine, run_id: str) -> int:
    """How many checkpoints a run wrote."""
    with Session(engine) as session:
        return int(session.exec(
            select(func.count()).select_from(Checkpoint).where(Checkpoint.run_id == run_id)
        ).one())
