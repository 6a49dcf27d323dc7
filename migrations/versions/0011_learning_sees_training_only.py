"""The learning role sees training episodes only: row-level security and a step view.

Eval, shadow, canary and production trajectories (and their steps) are what governance
judges a candidate on; training on them would let the score buy itself a promotion.

- ``trajectory``: row-level security limits the learning role's SELECT to rows of
  training runs; every other service role keeps what its GRANTs give it.
- ``step``: PostgreSQL refuses ``COPY FROM`` into a table with row-level security, and the
  execution loop writes steps by binary COPY. So the learning role loses SELECT on
  ``step`` and reads ``learning_step`` instead, a security-barrier view of the steps of
  training trajectories only.

The table owner (migrations, SECURITY DEFINER functions) is not subject to either.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-30
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OTHERS = "triloop_execution, triloop_governance, triloop_web"

UP = f"""
ALTER TABLE trajectory ENABLE ROW LEVEL SECURITY;
CREATE POLICY trajectory_learning_training_only ON trajectory FOR SELECT TO triloop_learning
    USING (purpose = 'training' AND run_id IS NOT NULL);
CREATE POLICY trajectory_other_services ON trajectory TO {OTHERS}
    USING (true) WITH CHECK (true);
REVOKE SELECT ON step FROM triloop_learning;
CREATE VIEW learning_step WITH (security_barrier) AS
    SELECT s.* FROM step s JOIN trajectory t ON t.id = s.trajectory_id
    WHERE t.purpose = 'training' AND t.run_id IS NOT NULL;
GRANT SELECT ON learning_step TO triloop_learning;
"""

DOWN = """
DROP VIEW IF EXISTS learning_step;
GRANT SELECT ON step TO triloop_learning;
DROP POLICY IF EXISTS trajectory_other_services ON trajectory;
DROP POLICY IF EXISTS trajectory_learning_training_only ON trajectory;
ALTER TABLE trajectory DISABLE ROW LEVEL SECURITY;
"""


def upgrade() -> None:
    op.execute(UP)


def downgrade() -> None:
    op.execute(DOWN)
