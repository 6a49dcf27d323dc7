"""An operator admits or rejects a task set with one recorded decision.

``human_decision.kind`` gains ``task_set_admission`` (subject: the task set's id;
decision: ``approve`` or ``reject``). Governance proves the row and sets the set's status
and every member task's with it, as it does for one task's ``admission``.

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-02
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0028"
down_revision: str | None = "0027"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# 0027 added 'task_set' (a registration decision).
KINDS_BEFORE = ("'audit', 'approval', 'admission', 'rollback', 'run_control', 'alarm_override',"
                " 'environment_version', 'eval_set', 'threshold', 'task_set'")
KINDS_AFTER = KINDS_BEFORE + ", 'task_set_admission'"


def _check(kinds: str) -> None:
    op.execute("ALTER TABLE human_decision DROP CONSTRAINT IF EXISTS human_decision_kind_check")
    op.execute(f"ALTER TABLE human_decision ADD CONSTRAINT human_decision_kind_check"
               f" CHECK (kind IN ({kinds}))")


def upgrade() -> None:
    _check(KINDS_AFTER)


def downgrade() -> None:
    # Decision rows are append-only: a database that recorded a task set's admission
    # cannot go back below this revision, because the constraint would refuse that row.
    _check(KINDS_BEFORE)
