"""Deployment history says what kind of move each revision was (bootstrap, promote, rollback).

A rollback walks back through an alias's history to the last revision whose
checkpoint was not rolled back since it was last promoted; for that it must tell
a rollback from a promotion without parsing free-text reasons. Existing rows are
classified from the reasons the code wrote until now.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-14
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

KINDS = ("bootstrap", "promote", "rollback", "move")


def upgrade() -> None:
    op.add_column(
        "deployment_history",
        sa.Column("kind", sa.String(), nullable=False, server_default="move"),
    )
    op.execute(
        "UPDATE deployment_history SET kind = CASE "
        "WHEN reason LIKE 'rollback %' THEN 'rollback' "
        "WHEN reason LIKE 'promotion %' THEN 'promote' "
        "WHEN reason LIKE 'bootstrap%' THEN 'bootstrap' ELSE 'move' END"
    )
    op.create_check_constraint(
        "deployment_history_kind", "deployment_history",
        "kind IN (" + ", ".join(f"'{k}'" for k in KINDS) + ")",
    )


def downgrade() -> None:
    op.drop_constraint("deployment_history_kind", "deployment_history", type_="check")
    op.drop_column("deployment_history", "kind")
