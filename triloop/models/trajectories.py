"""Episodes (trajectories) and their steps, with token ids exactly as generated."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import ARRAY, Column, Float, Text, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlmodel import Field, SQLModel

from triloop.models._columns import (
    created_at_field,
    float_array_field,
    int_array_field,
    json_field,
    small_int_array_field,
)


class Trajectory(SQLModel, table=True):
    """One episode. ``id`` is the episode id, so retried writes are idempotent."""

    __tablename__ = "trajectory"
    id: str = Field(primary_key=True)
    batch_id: str = Field(index=True)
    run_id: str | None = Field(default=None, index=True)
    task_id: str = Field(foreign_key="task.id", index=True)
    checkpoint_id: str = Field(index=True)
    purpose: str = Field(description="training | eval | production | shadow | canary")
    group_id: str = Field(description="same task and seed; GRPO normalises within it")
    sample_index: int = 0
    policy_version: int = Field(default=0, description="iteration of the behaviour policy")
    status: str = Field(description="completed | truncated | failed")
    failure_reason: str | None = None
    success: bool = False
    total_reward: float = Field(default=0.0, sa_column=Column(Float, nullable=False))
    num_steps: int = 0
    outcome: dict[str, Any] = json_field()
    created_at: datetime = created_at_field()


class Step(SQLModel, table=True):
    """One turn: its feedback and reward, and where its prompt and action sit in the
    trajectory's token sequence (``TrajectorySequence``), as offsets into ``token_ids``.

    The turn's prompt is ``token_ids[prompt_start:action_start]``, the tokens this turn
    added before the model acted (template, observation) are
    ``token_ids[observation_start:action_start]``, and its action is
    ``token_ids[action_start:action_end]``.
    """

    __tablename__ = "step"
    trajectory_id: str = Field(foreign_key="trajectory.id", primary_key=True)
    index: int = Field(primary_key=True)
    prompt_start: int = Field(default=0, description="token offset where the prompt begins")
    observation_start: int = Field(default=0, description="token offset of the new context")
    action_start: int = Field(default=0, description="token offset of the first action token")
    action_end: int = Field(default=0, description="token offset just past the action")
    observation: str = ""
    action_text: str = ""
    feedback: dict[str, Any] = json_field()
    reward: float = Field(default=0.0, sa_column=Column(Float, nullable=False))
    done: bool = False
    policy_version: int | None = Field(
        default=None, description="version that sampled this turn; None: the trajectory's")


class TrajectorySequence(SQLModel, table=True):
    """An episode's tokens as one sequence: the first prompt once, then per turn the new
    context (observation span) and the action span, exactly as generated.

    A turn whose prompt does not extend the sequence so far (a context rule that drops
    old turns, an agent that rewrote its history) opens a new segment holding that whole
    prompt; ``segment_starts`` lists where each segment begins. Tokens attend only
    within their segment.
    """

    __tablename__ = "trajectory_sequence"
    trajectory_id: str = Field(foreign_key="trajectory.id", primary_key=True)
    token_ids: list[int] = int_array_field()
    action_mask: list[int] = small_int_array_field()  # 1 on tokens the policy sampled
    # One per action-mask token, in order (none for the rest): the behaviour logprobs.
    behaviour_logprobs: list[float] = float_array_field()
    segment_starts: list[int] = int_array_field()


class RolloutBatch(SQLModel, table=True):
    """A batch somebody asked for: execution writes trajectories into requested batches only.

    The requester writes it under its own role before it asks: governance for its eval
    batches, the web service for people's production traffic, and execution's Nexus handler
    for learning's training batches (the caller proven by the Temporal server). The
    database stamps ``recorded_by`` and refuses a requester that role cannot vouch for.
    """

    __tablename__ = "rollout_batch"
    id: str = Field(primary_key=True)
    purpose: str
    checkpoint_id: str | None = Field(default=None, description="None: routing decides")
    run_id: str | None = None
    requested_by: str = Field(description="learning | governance | web")
    # Episode id -> {"task_id", "seed"}: the only episodes the database stores in this batch
    # and the gates count (``triloop.episode_plan``). None only on rows from before plans.
    planned_episodes: dict[str, Any] | None = Field(
        default=None, sa_column=Column(JSONB, nullable=True))
    task_ids: list[str] | None = Field(
        default=None, sa_column=Column(ARRAY(Text), nullable=True),
        description="the tasks the batch was asked for (None: not recorded, as before 0022);"
                    " a training batch on a held-out task is refused")
    recorded_by: str = Field(
        default=None,
        sa_column=Column(Text, nullable=False, server_default=text("current_user")),
        description="the database role that inserted the row (set by the database)",
    )
    created_at: datetime = created_at_field()


class Verdict(SQLModel, table=True):
    """The verifier's own judgement of a stored episode: replayed in a fresh environment of
    the pinned version and judged by the contract's verifier (``verifier/``).

    Only ``triloop_verifier`` inserts here and the database stamps ``recorded_by``; the gates
    count these, not execution's ``success``/``total_reward``, for eval, shadow, canary and
    production episodes. Rows never change.
    """

    __tablename__ = "verdict"
    trajectory_id: str = Field(foreign_key="trajectory.id", primary_key=True)
    batch_id: str
    success: bool
    total_reward: float = Field(sa_column=Column(Float, nullable=False))
    agrees: bool = Field(description="execution's own row said the same success and reward")
    details: dict[str, Any] = json_field()
    recorded_by: str = Field(
        default=None,
        sa_column=Column(Text, nullable=False, server_default=text("current_user")),
        description="the database role that inserted the row (set by the database)",
    )
    created_at: datetime = created_at_field()
