"""Trajectory storage: one transaction per episode or per group, one token sequence per
episode, steps by binary COPY.

An episode's id is the trajectory's primary key, so writing is idempotent: the
trajectory row goes in with ``ON CONFLICT DO NOTHING`` and its steps follow in the
same transaction only when that insert created the row. A retried activity, or two
workers racing on the same episode, leave exactly one trajectory and one set of steps.

The episode's tokens are stored once, as one ``trajectory_sequence`` row (the first
prompt, then per turn the new context and the action, with the action mask and the
behaviour logprobs; see ``triloop.token_sequence`` for the layout and the rule when a
prompt does not extend the sequence). Each ``step`` row keeps the turn's feedback and
reward and points into the sequence by token offsets, so storage grows linearly with
the turns (``bench/sequence_layout.py`` measures it against one full prompt per step).

``write_trajectories`` stores a group of episodes the same way in one transaction: one
existence query, one authorization per set of episodes whose decision inputs are the same
(the policy sees every id of the set), the rows with ``ON CONFLICT DO NOTHING``, then the
sequences and one COPY with the steps of the rows that insert created.

Steps go through ``COPY step FROM STDIN (FORMAT BINARY)``, the sequence's arrays travel
as PostgreSQL binary arrays, with no text formatting or parsing on either side
(``bench/rollout.py`` measures COPY against per-row INSERTs).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from psycopg import Cursor
from psycopg.types.json import Jsonb
from sqlalchemy import Engine
from sqlmodel import Session, col, select

from triloop.metrics import count_stored_episodes
from triloop.models import Step, Trajectory, TrajectorySequence
from triloop.policy import Actor, Authorizer, PolicyDenied, Resource
from triloop.token_sequence import (
    SequenceLayoutError,
    TokenSequence,
    TurnOffsets,
    TurnTokens,
    marks_only_the_action,
    pack_turns,
    unpack_turns,
)

EXECUTION = Actor(service="execution")

STEP_COLUMNS = (
    "trajectory_id", "index", "prompt_start", "observation_start", "action_start", "action_end",
    "observation", "action_text", "feedback", "reward", "done", "policy_version",
)
_STEP_TYPES = (
    "text", "int4", "int4", "int4", "int4", "int4", "text", "text", "jsonb", "float8", "bool",
    "int4",
)
_INSERT_SEQUENCE = (
    "INSERT INTO trajectory_sequence (trajectory_id, token_ids, action_mask, behaviour_logprobs,"
    " segment_starts) VALUES (%s, %s::int4[], %s::int2[], %s::float8[], %s::int4[])"
)
_TRAJECTORY_COLUMNS = (
    "id", "batch_id", "run_id", "task_id", "checkpoint_id", "purpose", "group_id",
    "sample_index", "policy_version", "status", "failure_reason", "success", "total_reward",
    "num_steps", "outcome",
)
# "index" is a keyword in SQL, so every step column is quoted.
_QUOTED_STEP_COLUMNS = ", ".join('"' + c + '"' for c in STEP_COLUMNS)
_COPY_STEPS = f"COPY step ({_QUOTED_STEP_COLUMNS}) FROM STDIN (FORMAT BINARY)"
_INSERT_STEP = (
    f"INSERT INTO step ({_QUOTED_STEP_COLUMNS}) VALUES ({', '.join(['%s'] * len(STEP_COLUMNS))})"
)
_INSERT_TRAJECTORY = (
    f"INSERT INTO trajectory ({', '.join(_TRAJECTORY_COLUMNS)}, created_at) "
    f"VALUES ({', '.join(['%s'] * len(_TRAJECTORY_COLUMNS))}, now()) "
    "ON CONFLICT (id) DO NOTHING RETURNING id"
)


@dataclass(frozen=True)
class StepRow:
    """One turn as generated: prompt and action token ids, mask and logprobs (stored packed
    into the trajectory's sequence), and its feedback and reward (stored on the step)."""

    index: int
    prompt_token_ids: Sequence[int]
    action_token_ids: Sequence[int]
    action_mask: Sequence[int]  # 1 = the model generated the token (trainable)
    behaviour_logprobs: Sequence[float]  # one per action token, from the sampling policy
    observation: str
    action_text: str
    feedback: Mapping[str, Any]
    reward: float
    done: bool
    # The policy version that sampled this turn when it differs from the trajectory's (a
    # continued cut episode's earlier turns); None: the trajectory's ``policy_version``.
    policy_version: int | None = None


@dataclass(frozen=True)
class TrajectoryRow:
    """One episode's summary row; ``id`` is the episode id."""

    id: str
    batch_id: str
    task_id: str
    checkpoint_id: str
    purpose: str  # training | eval | production | shadow | canary
    group_id: str
    status: str  # completed | truncated | failed
    sample_index: int = 0
    run_id: str | None = None
    policy_version: int = 0
    failure_reason: str | None = None
    success: bool = False
    total_reward: float = 0.0
    num_steps: int = 0
    outcome: Mapping[str, Any] = field(default_factory=dict)


def _text(value: str) -> str:
    # PostgreSQL text cannot hold NUL; agent output sometimes does.
    return value.replace("\x00", "\ufffd")


def _dumps(obj: Any) -> str:
    return json.dumps(obj, default=str).replace("\\u0000", "\\ufffd")


def _step_values(trajectory_id: str, step: StepRow, at: TurnOffsets) -> tuple[Any, ...]:
    return (
        trajectory_id, step.index, at.prompt_start, at.observation_start, at.action_start,
        at.action_end, _text(step.observation), _text(step.action_text),
        Jsonb(dict(step.feedback), _dumps), float(step.reward), bool(step.done),
        step.policy_version,
    )


def pack_steps(steps: Sequence[StepRow]) -> tuple[TokenSequence, list[TurnOffsets]]:
    """The episode's token sequence and each step's offsets into it (in step order).

    The stored mask is 1 on exactly the actions; a step whose own mask (over its prompt +
    action) says anything else is refused rather than stored as something it is not.
    """
    for step in steps:
        mask = step.action_mask
        if mask and not marks_only_the_action(
                mask, len(step.prompt_token_ids), len(step.action_token_ids)):
            raise SequenceLayoutError(
                f"step {step.index}: its action mask does not mark exactly its"
                f" {len(step.action_token_ids)} action tokens after its"
                f" {len(step.prompt_token_ids)} prompt tokens")
    return pack_turns([
        TurnTokens(s.prompt_token_ids, s.action_token_ids, s.behaviour_logprobs) for s in steps
    ])


def copy_steps(
    cursor: Cursor[Any], trajectory_id: str, steps: Iterable[tuple[StepRow, TurnOffsets]]
) -> int:
    """Write steps with one binary COPY; returns how many rows went in."""
    count = 0
    with cursor.copy(_COPY_STEPS) as copy:
        copy.set_types(list(_STEP_TYPES))
        for step, at in steps:
            copy.write_row(_step_values(trajectory_id, step, at))
            count += 1
    return count


def insert_steps_per_row(
    cursor: Cursor[Any], trajectory_id: str, steps: Iterable[tuple[StepRow, TurnOffsets]]
) -> int:
    """Write steps with one INSERT statement per row (the baseline the bench compares)."""
    count = 0
    for step, at in steps:
        cursor.execute(_INSERT_STEP, _step_values(trajectory_id, step, at))
        count += 1
    return count


def insert_steps_pipelined(
    cursor: Cursor[Any], trajectory_id: str, steps: Iterable[tuple[StepRow, TurnOffsets]]
) -> int:
    """Write steps with psycopg's ``executemany`` (one pipelined INSERT per row)."""
    values = [_step_values(trajectory_id, step, at) for step, at in steps]
    cursor.executemany(_INSERT_STEP, values)
    return len(values)


def insert_sequence(cursor: Cursor[Any], trajectory_id: str, sequence: TokenSequence) -> None:
    """Write the episode's one token sequence."""
    cursor.execute(_INSERT_SEQUENCE, (
        trajectory_id, sequence.token_ids, sequence.action_mask, sequence.behaviour_logprobs,
        sequence.segment_starts,
    ))


StepWriter = Callable[[Cursor[Any], str, Iterable[tuple[StepRow, TurnOffsets]]], int]
STEP_WRITERS: dict[str, StepWriter] = {
    "copy": copy_steps, "insert": insert_steps_per_row, "executemany": insert_steps_pipelined,
}


def _trajectory_values(row: TrajectoryRow) -> tuple[Any, ...]:
    return (
        row.id, row.batch_id, row.run_id, row.task_id, row.checkpoint_id, row.purpose,
        row.group_id, row.sample_index, row.policy_version, row.status, row.failure_reason,
        row.success, float(row.total_reward), row.num_steps, Jsonb(dict(row.outcome), _dumps),
    )


def insert_trajectory(
    cursor: Cursor[Any], trajectory: TrajectoryRow, steps: Sequence[StepRow], *,
    method: str = "copy",
) -> bool:
    """Insert inside the caller's transaction; False (and nothing written) if the id exists.

    An episode without steps has no sequence row. Turns whose logprobs do not match their
    action raise ``SequenceLayoutError`` before anything is written.

    ``method`` names a ``STEP_WRITERS`` entry; only the bench uses anything but COPY.
    """
    sequence, offsets = pack_steps(steps)  # refuses before anything is written
    cursor.execute(_INSERT_TRAJECTORY, _trajectory_values(trajectory))
    if cursor.fetchone() is None:
        return False
    if steps:
        insert_sequence(cursor, trajectory.id, sequence)
    STEP_WRITERS[method](cursor, trajectory.id, zip(steps, offsets, strict=True))
    return True


def _insert_trajectories(
    cursor: Cursor[Any], episodes: Sequence[tuple[TrajectoryRow, Sequence[StepRow]]]
) -> set[str]:
    """Insert rows (first write wins), each new one's token sequence, then one COPY with
    the new rows' steps; the new ids. Every episode's turns are packed (and a layout that
    does not fit refused) before anything is written."""
    packed = {row.id: pack_steps(steps) for row, steps in episodes}
    created: set[str] = set()
    for row, steps in episodes:
        cursor.execute(_INSERT_TRAJECTORY, _trajectory_values(row))
        if cursor.fetchone() is not None:
            created.add(row.id)
            if steps:
                insert_sequence(cursor, row.id, packed[row.id][0])
    if any(steps for row, steps in episodes if row.id in created):
        with cursor.copy(_COPY_STEPS) as copy:
            copy.set_types(list(_STEP_TYPES))
            for row, steps in episodes:
                if row.id in created:
                    for step, at in zip(steps, packed[row.id][1], strict=True):
                        copy.write_row(_step_values(row.id, step, at))
    return created


def trajectory_resource(trajectory: TrajectoryRow) -> Resource:
    """The policy resource for creating this trajectory."""
    return Resource(
        "trajectory",
        trajectory.id,
        attrs={
            "purpose": trajectory.purpose,
            "batch_id": trajectory.batch_id,
            "run_id": trajectory.run_id,
            "task_id": trajectory.task_id,
            "checkpoint_id": trajectory.checkpoint_id,
            "status": trajectory.status,
            "num_steps": trajectory.num_steps,
        },
    )


def write_trajectory(
    *,
    engine: Engine,
    authorizer: Authorizer,
    trajectory: TrajectoryRow,
    steps: Sequence[StepRow],
) -> bool:
    """Authorize, then store the episode and its steps in one transaction.

    Returns True when this call wrote it, False when the episode was already stored
    (a retried activity): never a second copy. ``PolicyDenied`` propagates and
    nothing is written. The insert is ``write_trajectories``'s, for a group of one.
    """
    if trajectory_statuses(engine=engine, ids=[trajectory.id]):
        return False
    authorizer.authorize(EXECUTION, "create", trajectory_resource(trajectory))
    return trajectory.id in _store_new(engine, [(trajectory, steps)])


def _store_new(
    engine: Engine, episodes: Sequence[tuple[TrajectoryRow, Sequence[StepRow]]]
) -> set[str]:
    """Authorized episodes in one transaction (first write wins); the ids this call wrote."""
    with engine.begin() as conn:
        raw = conn.connection.driver_connection
        with raw.cursor() as cursor:  # type: ignore[union-attr]
            written = _insert_trajectories(cursor, episodes)
    # Counted once committed: rollout throughput on the execution worker's /metrics.
    count_stored_episodes((row.purpose, row.status, len(steps))
                          for row, steps in episodes if row.id in written)
    return written


# What one authorization of a set decides over: the facts every episode of the set shares.
_SHARED_ATTRS = ("purpose", "batch_id", "run_id", "task_id", "checkpoint_id", "group_id")


def trajectory_set_resource(trajectories: Sequence[TrajectoryRow]) -> Resource:
    """The policy resource for creating several trajectories that share ``_SHARED_ATTRS``.

    One episode gets ``trajectory_resource``, exactly as a lone write. A set is named by
    its group and lists every id, status and step count, so the decision (and its audit
    event) covers each episode it lets in.
    """
    if len(trajectories) == 1:
        return trajectory_resource(trajectories[0])
    first = trajectories[0]
    shared = {name: getattr(first, name) for name in _SHARED_ATTRS}
    if any({name: getattr(t, name) for name in _SHARED_ATTRS} != shared for t in trajectories):
        raise ValueError("one authorization covers only trajectories with the same "
                         f"{', '.join(_SHARED_ATTRS)}")
    return Resource("trajectory", first.group_id, attrs={
        **shared,
        "trajectory_ids": [t.id for t in trajectories],
        "statuses": [t.status for t in trajectories],
        "num_steps": [t.num_steps for t in trajectories],
    })


def authorization_sets(
    trajectories: Sequence[TrajectoryRow],
) -> list[list[TrajectoryRow]]:
    """The rows split by the facts a decision depends on, in first-seen order."""
    sets: dict[tuple[Any, ...], list[TrajectoryRow]] = {}
    for row in trajectories:
        sets.setdefault(tuple(getattr(row, n) for n in _SHARED_ATTRS), []).append(row)
    return list(sets.values())


@dataclass(frozen=True)
class GroupWrite:
    """What ``write_trajectories`` did with each episode it was given."""

    written: set[str] = field(default_factory=set)  # stored by this call
    present: dict[str, str] = field(default_factory=dict)  # stored before: id -> status
    denied: dict[str, str] = field(default_factory=dict)  # refused by the policy: id -> why


def write_trajectories(
    *,
    engine: Engine,
    authorizer: Authorizer,
    episodes: Sequence[tuple[TrajectoryRow, Sequence[StepRow]]],
    present: Mapping[str, str] | None = None,
) -> GroupWrite:
    """Authorize each set of alike episodes once, then store all allowed ones in one transaction.

    Episodes already stored (a retried activity) are neither authorized nor written again;
    ``present`` is what the caller has just read of that (None: look it up here). A row
    stored meanwhile by a concurrent run still wins: the insert skips it.
    A denied set writes none of its episodes and does not stop the other sets.
    """
    if not episodes:
        return GroupWrite()
    present = dict(present) if present is not None else trajectory_statuses(
        engine=engine, ids=[row.id for row, _ in episodes])
    fresh = [(row, steps) for row, steps in episodes if row.id not in present]
    allowed: set[str] = set()
    denied: dict[str, str] = {}
    for alike in authorization_sets([row for row, _ in fresh]):
        try:
            authorizer.authorize(EXECUTION, "create", trajectory_set_resource(alike))
        except PolicyDenied as refusal:
            denied.update({row.id: str(refusal) for row in alike})
        else:
            allowed.update(row.id for row in alike)
    to_write = [(row, steps) for row, steps in fresh if row.id in allowed]
    written = _store_new(engine, to_write) if to_write else set()
    if len(written) < len(to_write):  # a concurrent run of some episode got there first
        present.update(trajectory_statuses(
            engine=engine, ids=[row.id for row, _ in to_write if row.id not in written]))
    return GroupWrite(written=written, present=present, denied=denied)


def trajectory_statuses(*, engine: Engine, ids: Sequence[str]) -> dict[str, str]:
    """Status of each stored episode among ``ids`` (missing ids are absent)."""
    if not ids:
        return {}
    with Session(engine) as session:
        rows = session.exec(
            select(Trajectory.id, Trajectory.status).where(col(Trajectory.id).in_(list(ids)))
        ).all()
    return {row[0]: row[1] for row in rows}


def load_steps(*, session: Session, trajectory_id: str) -> list[Step]:
    """An episode's steps in order."""
    query = select(Step).where(Step.trajectory_id == trajectory_id).order_by(col(Step.index))
    return list(session.exec(query).all())


def load_turn_tokens(*, session: Session, trajectory_id: str) -> list[TurnTokens]:
    """Each stored step's prompt, action and behaviour logprobs, sliced out of the sequence."""
    steps = load_steps(session=session, trajectory_id=trajectory_id)
    if not steps:
        return []
    row = session.get(TrajectorySequence, trajectory_id)
    if row is None:
        raise LookupError(f"trajectory {trajectory_id!r} has steps but no token sequence")
    sequence = TokenSequence(list(row.token_ids), list(row.action_mask),
                             list(row.behaviour_logprobs), list(row.segment_starts))
    return unpack_turns(sequence, [step_offsets(s) for s in steps])


def step_offsets(step: Step) -> TurnOffsets:
    """A stored step's offsets into its trajectory's sequence."""
    return TurnOffsets(step.prompt_start, step.observation_start, step.action_start,
                       step.action_end)

