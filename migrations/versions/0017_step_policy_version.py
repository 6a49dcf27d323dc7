"""Each step may name the policy version that sampled it (partial rollouts, issue 18).

A cut episode continued under a newer policy keeps its earlier turns, sampled by an older
one; the learner's off-policy guard needs each turn's version. ``step.policy_version`` is
that version, or NULL when it is the trajectory's own (every step before partial rollouts).
``learning_step`` (migration 0011) selected ``s.*`` when it was created, so it is
recreated to carry the new column.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-01
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

VIEW = """
CREATE VIEW learning_step WITH (security_barrier) AS
    SELECT s.* FROM step s JOIN trajectory t ON t.id = s.trajectory_id
    WHERE t.purpose = 'training' AND t.run_id IS NOT NULL;
GRANT SELECT ON learning_step TO triloop_learning;
"""


def upgrade() -> None:
    op.execute("DROP VIEW IF EXISTS learning_step")
    op.execute("ALTER TABLE step ADD COLUMN policy_version integer")
    op.execute(VIEW)


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS learning_step")
    op.execute("ALTER TABLE step DROP COLUMN policy_version")
    op.execute(VIEW)
