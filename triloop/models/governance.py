"""Promotions and their gates, human decisions, deployments (aliases) and routing."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Column, Float
from sqlmodel import Field, SQLModel

from triloop.models._columns import (
    bigint_pk_field,
    created_at_field,
    json_field,
    new_id,
    text_array_field,
    timestamp_field,
)


class Promotion(SQLModel, table=True):
    """A candidate's way through the gates, opened by governance from a proposal."""

    __tablename__ = "promotion"
    id: str = Field(default_factory=new_id, primary_key=True)
    proposal_id: str = Field(foreign_key="proposal.id", unique=True)
    checkpoint_id: str = Field(foreign_key="checkpoint.id", index=True)
    run_id: str = Field(index=True)
    submitted_by: str
    baseline_checkpoint_id: str | None = None
    workflow_id: str | None = None
    # The run that opened the promotion: a reset keeps the workflow id and makes a new run,
    # and governance refuses every state change from any run but this one.
    workflow_run_id: str | None = None
    status: str = Field(
        default="open",
        description="open | rejected | aborted | promoted | rolled_back | expired | "
                    "terminated | cancelled | failed",
    )
    current_gate: str | None = None
    status_reason: str | None = None
    created_at: datetime = created_at_field()
    updated_at: datetime | None = timestamp_field()


class GateResult(SQLModel, table=True):
    """One gate's verdict with its evidence and the threshold version it used."""

    __tablename__ = "gate_result"
    id: str = Field(default_factory=new_id, primary_key=True)
    promotion_id: str = Field(foreign_key="promotion.id", index=True)
    gate: str
    passed: bool
    reasons: list[str] = text_array_field()
    evidence: dict[str, Any] = json_field()
    threshold_id: str | None = Field(default=None, foreign_key="threshold.id")
    eval_set_id: str | None = Field(default=None, foreign_key="eval_set.id")
    created_at: datetime = created_at_field()


class Approval(SQLModel, table=True):
    """A human decision: an auditor's sign-off or an operator's approval."""

    __tablename__ = "approval"
    id: str = Field(default_factory=new_id, primary_key=True)
    promotion_id: str = Field(foreign_key="promotion.id", index=True)
    kind: str = Field(description="audit | operator")
    decision: str = Field(description="approve | reject")
    user_name: str
    comment: str
    created_at: datetime = created_at_field()


class Deployment(SQLModel, table=True):
    """An alias (e.g. ``production``) naming a checkpoint, with its rollback target."""

    __tablename__ = "deployment"
    alias: str = Field(primary_key=True)
    checkpoint_id: str = Field(foreign_key="checkpoint.id")
    rollback_target_id: str | None = Field(default=None, foreign_key="checkpoint.id")
    promotion_id: str | None = None
    updated_by: str
    updated_at: datetime = created_at_field()


class DeploymentHistory(SQLModel, table=True):
    """Every alias move, for lineage and audit."""

    __tablename__ = "deployment_history"
    id: int | None = bigint_pk_field()
    alias: str = Field(index=True)
    checkpoint_id: str
    previous_checkpoint_id: str | None = None
    kind: str = Field(
        default="move",
        description="bootstrap | promote | rollback | move (what kind of move this revision was)",
    )
    reason: str
    actor: str
    created_at: datetime = created_at_field()


class Routing(SQLModel, table=True):
    """Which checkpoint serves which slot of production traffic."""

    __tablename__ = "routing"
    slot: str = Field(primary_key=True, description="production | canary | shadow")
    checkpoint_id: str | None = Field(default=None, foreign_key="checkpoint.id")
    share: float = Field(default=0.0, sa_column=Column(Float, nullable=False))
    promotion_id: str | None = None
    updated_by: str
    updated_at: datetime = created_at_field()
    # A shadow or canary claim counts only until then (database clock) and only while its
    # promotion is open, so a claim clears itself when its promotion can no longer release
    # it (see ``triloop.routing_claims``). None: no expiry (the production slot).
    claim_expires_at: datetime | None = timestamp_field()


class WorkflowInterruption(SQLModel, table=True):
    """A reset, termination or cancellation of a governance workflow run, audited once."""

    __tablename__ = "workflow_interruption"
    workflow_id: str = Field(primary_key=True)
    run_id: str = Field(primary_key=True)
    kind: str = Field(primary_key=True,
                      description="reset | terminated | cancelled | failed | timed_out")
    promotion_id: str | None = Field(default=None, foreign_key="promotion.id")
    details: dict[str, Any] = json_field()
    recorded_at: datetime = created_at_field()
