"""Training runs, their per-iteration metrics, checkpoints (lineage) and proposals."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Column, Float, Integer
from sqlmodel import Field, SQLModel

from triloop.models._columns import (
    created_at_field,
    json_field,
    new_id,
    text_array_field,
    timestamp_field,
)


class TrainingRun(SQLModel, table=True):
    """A training run submitted by an ML engineer."""

    __tablename__ = "training_run"
    id: str = Field(default_factory=new_id, primary_key=True)
    name: str = ""
    submitted_by: str = Field(index=True)
    config: dict[str, Any] = json_field()
    base_checkpoint_id: str | None = Field(default=None, foreign_key="checkpoint.id")
    environment_version_ids: list[str] = text_array_field()
    workflow_id: str | None = Field(default=None, index=True)
    status: str = Field(
        default="submitted",
        description="submitted | running | paused | completed | completed_with_alarms | cancelled"
        " | failed",
    )
    status_reason: str | None = None
    iterations_done: int = 0
    created_at: datetime = created_at_field()
    updated_at: datetime | None = timestamp_field()


class TrainingStep(SQLModel, table=True):
    """One iteration's metrics and stability monitors."""

    __tablename__ = "training_step"
    run_id: str = Field(foreign_key="training_run.id", primary_key=True)
    iteration: int = Field(primary_key=True)
    loss: float | None = Field(default=None, sa_column=Column(Float))
    kl: float | None = Field(default=None, sa_column=Column(Float))
    entropy: float | None = Field(default=None, sa_column=Column(Float))
    reward_mean: float | None = Field(default=None, sa_column=Column(Float))
    reward_variance: float | None = Field(default=None, sa_column=Column(Float))
    within_group_reward_variance: float | None = Field(default=None, sa_column=Column(Float))
    grad_norm: float | None = Field(default=None, sa_column=Column(Float))
    discrimination: float | None = Field(
        default=None, sa_column=Column(Float), description="cross-input retrieval accuracy"
    )
    trainable_tokens: int | None = Field(default=None, sa_column=Column(Integer))
    length_stats: dict[str, Any] = json_field()
    metrics: dict[str, Any] = json_field()
    alarms: list[str] = text_array_field()
    checkpoint_id: str | None = None
    created_at: datetime = created_at_field()


class Checkpoint(SQLModel, table=True):
    """Policy weights; id = sha256 of the weights. Parent links form the lineage graph."""

    __tablename__ = "checkpoint"
    id: str = Field(primary_key=True)
    parent_id: str | None = Field(default=None, foreign_key="checkpoint.id", index=True)
    run_id: str | None = Field(default=None, index=True)
    base_model: str
    iteration: int | None = None
    environment_version_ids: list[str] = text_array_field()
    data: dict[str, Any] = json_field()
    artifact_uri: str
    # What the weights are served with: sha256 of the tokenizer files, of config.json
    # (canonical JSON, without transformers_version) and of the chat template.
    tokenizer_sha256: str | None = None
    model_config_sha256: str | None = None
    chat_template_sha256: str | None = None
    # An imported base model (migration 0024): the name people give it (unique; RUN.yaml's
    # model.base may use it), where it came from, its size and its dtypes. NULL on
    # checkpoints triloop trained.
    name: str | None = Field(default=None, unique=True)
    source_kind: str | None = Field(default=None, description="huggingface | gguf")
    parameter_count: int | None = Field(default=None, sa_column=Column(BigInteger))
    source_dtype: str | None = Field(
        default=None, description="the weights' dtype at the source: float32, bfloat16, q4_1 ...")
    dtype: str | None = Field(default=None, description="the dtype the weights are stored in")
    created_by: str
    created_at: datetime = created_at_field()


class Proposal(SQLModel, table=True):
    """The learning loop's only write that faces governance."""

    __tablename__ = "proposal"
    id: str = Field(default_factory=new_id, primary_key=True)
    checkpoint_id: str = Field(foreign_key="checkpoint.id", index=True)
    run_id: str = Field(foreign_key="training_run.id", index=True)
    submitted_by: str = Field(description="the run's submitter (separation of duties)")
    evidence: dict[str, Any] = json_field()
    created_at: datetime = created_at_field()
