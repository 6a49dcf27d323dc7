"""Row-level security: the learning role sees training episodes only.

Eval, shadow, canary and production trajectories (and their steps) are what governance
judges a candidate on; training on them would let the score buy itself a promotion. The
learning role's SELECT on ``trajectory`` and ``step`` is limited to rows of training
runs; every other service role keeps what its GRANTs give it. The table owner (migrations,
SECURITY DEFINER functions) is not subject to these policies.

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
ALTER TABLE step ENABLE ROW LEVEL SECURITY;
CREATE POLICY trajectory_learning_training_only ON trajectory FOR SELECT TO triloop_learning
    USING (purpose = 'training' AND run_id IS NOT NULL);
CREATE POLICY trajectory_other_services ON trajectory TO {OTHERS}
    USING (true) WITH CHECK (true);
-- The subquery runs under the reader's own policies: only visible trajectories match.
CREATE POLICY step_learning_training_only ON step FOR SELECT TO triloop_learning
    USING (EXISTS (SELECT 1 FROM trajectory t WHERE t.id = step.trajectory_id));
CREATE POLICY step_other_services ON step TO {OTHERS}
    USING (true) WITH CHECK (true);
"""

DOWN = """
DROP POLICY IF EXISTS step_other_services ON step;
DROP POLICY IF EXISTS step_learning_training_only ON step;
DROP POLICY IF EXISTS trajectory_other_services ON trajectory;
DROP POLICY IF EXISTS trajectory_learning_training_only ON trajectory;
ALTER TABLE step DISABLE ROW LEVEL SECURITY;
ALTER TABLE trajectory DISABLE ROW LEVEL SECURITY;
"""


def upgrade() -> None:
    op.execute(UP)


def downgrade() -> None:
    op.execute(DOWN)
