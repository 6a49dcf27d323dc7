"""An operator's override of a candidate's stability alarms is a recorded human decision.

``human_decision.kind`` gains ``alarm_override`` (subject: a promotion; decision:
``override``; the comment is the operator's written reason). Like every other decision,
only the web role may insert it, after it authenticated the operator and OPA allowed it.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

KINDS_BEFORE = "'audit', 'approval', 'admission', 'rollback', 'run_control'"
KINDS_AFTER = KINDS_BEFORE + ", 'alarm_override'"


def _check(kinds: str) -> None:
    op.execute("ALTER TABLE human_decision DROP CONSTRAINT IF EXISTS human_decision_kind_check")
    op.execute(f"ALTER TABLE human_decision ADD CONSTRAINT human_decision_kind_check"
               f" CHECK (kind IN ({kinds}))")


def upgrade() -> None:
    _check(KINDS_AFTER)


def downgrade() -> None:
    # Rows are append-only (a trigger refuses DELETE), so a database that recorded an
    # override cannot go back below this revision: the constraint would refuse them.
    _check(KINDS_BEFORE)
