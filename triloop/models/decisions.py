"""A person's decision as the web service recorded it: the only proof that a person decided.

Only ``triloop_web`` may insert a row, after it authenticated the person and the policy
allowed the action; ``recorded_by`` is filled in by the database with the inserting role
(a trigger refuses any other value) and no role may change or delete a row. Temporal
updates and signals carry just the row's id: governance and learning load the person
from here and their current roles from ``app_user``, never from a payload.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Column, Text, text
from sqlmodel import Field, SQLModel

from triloop.models._columns import created_at_field, json_field, new_id
from triloop.statuses import DecisionKind

__all__ = ["WEB_ROLE", "DecisionKind", "DecisionUse", "HumanDecisionRow"]

WEB_ROLE = "triloop_web"


class HumanDecisionRow(SQLModel, table=True):
    """One decision of one signed-in person, as stored (``triloop.decisions.HumanDecision``
    is the same decision as a loop may trust it)."""

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


class DecisionUse(SQLModel, table=True):
    """A decision carried out: one row per decision (migration 0020), written by the loop
    that proved it, naming the activity execution that used it. A second use is refused."""

    __tablename__ = "decision_use"
    decision_id: str = Field(foreign_key="human_decision.id", primary_key=True)
    used_by: str = Field(
        default=None,
        sa_column=Column(Text, nullable=False, server_default=text("current_user")),
        description="the database role that used it (set by the database)",
    )
    execution: str = Field(description="workflow run and activity that carried it out")
    used_at: datetime = created_at_field()
