"""Thresholds name the eval sets they apply to, per environment.

Issue 26, item 5. One global ``promotion`` threshold judged every candidate on one eval
set (the demo's frozen_lake), whatever it was trained on. ``threshold.eval_sets`` maps an
environment name (or one environment version's id) to the frozen eval sets a candidate
trained on it is judged on; ``threshold.eval_set_id`` stays the default for environments
the map does not name, and may now be NULL when the map names every environment. A
candidate trained on two environments is judged on each one's eval sets and must pass all
(docs/gates.md). A threshold names at least one eval set (a CHECK).

Revision ID: 0029
Revises: 0028
Create Date: 2026-12-02
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0029"
# For this branch's own tests it follows 0026 (the newest on it); merged, it follows 0029.
down_revision: str | None = "0028"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("""
        ALTER TABLE threshold ADD COLUMN eval_sets jsonb;
        ALTER TABLE threshold ADD CONSTRAINT threshold_eval_sets_object
            CHECK (eval_sets IS NULL OR jsonb_typeof(eval_sets) = 'object');
        ALTER TABLE threshold ADD CONSTRAINT threshold_names_an_eval_set
            CHECK (eval_set_id IS NOT NULL OR eval_sets IS NOT NULL) NOT VALID;
    """)


def downgrade() -> None:
    op.execute("""
        ALTER TABLE threshold DROP CONSTRAINT threshold_names_an_eval_set;
        ALTER TABLE threshold DROP CONSTRAINT threshold_eval_sets_object;
        ALTER TABLE threshold DROP COLUMN eval_sets;
    """)
