"""A person's decision as the web service recorded it: the only proof that a person decided.

Only ``triloop_web`` may insert a row, after it authenticated the person and the policy
allowed the action; ``recorded_by`` is filled in by the database with the inserting role
(a trigger refuses any other value) and no role may change or delete a row. Temporal
updates and signals carry just the row's id: governance and learning load the person
from here and their current roles from ``app_user``, never from a payload.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import Column, Text, text
from sqlmodel import Field, SQLModel

from triloop.models._columns import created_at_field, json_field, new_id

WEB_ROLE = "triloop_web"


class DecisionKind(StrEnum):
    """What a person decided about, and so what ``subject`` names."""

    AUDIT = "audit"  # subject: a promotion; decision: sign | reject
    APPROVAL = "approval"  # subject: a promotion; decision: approve | reject
    ADMISSION = "admission"  # subject: a task; decision: approve | reject
    ROLLBACK = "rollback"  # subject: a deployment alias; decision: rollback
    RUN_CONTROL = "run_control"  # subject: a training run; decision: pause | resume | cancel
    # subject: a promotion; decision: override (its run's stability alarms; comment: why)
    ALARM_OVERRIDE = "alarm_override"
    # subject: an environment's name; decision: register (details: contract text, fixtures)
    ENVIRONMENT_VERSION = "environment_version"
    # subject: an eval set's name; decision: create (details: task ids; frozen at once)
    EVAL_SET = "eval_set"
    # subject: a threshold's name; decision: set (details: spec, eval set)
    THRESHOLD = "threshold"


class HumanDecision(SQLModel, table=True):
    """One decision of one signed-in person."""

    __tablename__ = "human_decision"
    id: str = Field(default_factory=new_id, primary_key=True)
    kind: str = Field(description="a DecisionKind")
    subject: str = Field(description="the promotion, task, alias or run decided about")
    decision: str
    comment: str = ""
    details: dict[str, Any] = json_field()
    user_name: str = Field(foreign_key="app_user.name", index=True)
    recorded_by: str = Field(
        default=None,
        sa_column=Column(Text, nullable=False, server_default=text("current_user")),
        description="the database role that inserted the row (set by the database)",
    )
    created_at: datetime = created_at_field()
