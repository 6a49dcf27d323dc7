"""A promotion belongs to one workflow run; routing claims expire; interruptions are recorded.

Issue 32, route 3: a reset of an ended ``PromotionWorkflow`` replayed it to the promote
step and moved production. A reset keeps the workflow id and makes a new run id, so the
promotion row now records the run that opened it (``workflow_run_id``) and governance
refuses every state change from any other run.

A terminated promotion runs no code, and it left the shadow slot serving its candidate.
A shadow or canary claim now carries ``claim_expires_at`` (database clock): readers count
the slot only while its promotion is open and the claim has not expired, so a claim clears
itself even when nothing of governance runs.

``workflow_interruption`` holds one row per (workflow, run, kind) that governance has
audited (a reset, a termination, a cancellation): its key makes each audit happen once.

Revision ID: 0023
Revises: 0019
Create Date: 2026-12-01
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("ALTER TABLE promotion ADD COLUMN workflow_run_id text")
    op.execute("ALTER TABLE routing ADD COLUMN claim_expires_at timestamptz")
    op.execute("""
        CREATE TABLE workflow_interruption (
            workflow_id text NOT NULL CHECK (workflow_id <> ''),
            run_id text NOT NULL CHECK (run_id <> ''),
            kind text NOT NULL CHECK (kind IN ('reset', 'terminated', 'cancelled', 'failed',
                                               'timed_out')),
            promotion_id text REFERENCES promotion (id),
            details jsonb NOT NULL DEFAULT '{}'::jsonb,
            recorded_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (workflow_id, run_id, kind)
        )
    """)
    op.execute("GRANT SELECT, INSERT ON workflow_interruption TO triloop_governance")
    op.execute("GRANT SELECT ON workflow_interruption TO triloop_web")


def downgrade() -> None:
    op.execute("DROP TABLE workflow_interruption")
    op.execute("ALTER TABLE routing DROP COLUMN claim_expires_at")
    op.execute("ALTER TABLE promotion DROP COLUMN workflow_run_id")
