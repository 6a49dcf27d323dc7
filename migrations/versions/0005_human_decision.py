"""Human decisions recorded by the web role only; the database says who inserted each row.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE = """
CREATE TABLE human_decision (
    id text PRIMARY KEY,
    kind text NOT NULL
        CHECK (kind IN ('audit', 'approval', 'admission', 'rollback', 'run_control')),
    subject text NOT NULL CHECK (subject <> ''),
    decision text NOT NULL CHECK (decision <> ''),
    comment text NOT NULL DEFAULT '',
    details jsonb NOT NULL DEFAULT '{}',
    user_name text NOT NULL REFERENCES app_user (name),
    recorded_by text NOT NULL DEFAULT current_user,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ix_human_decision_user_name ON human_decision (user_name);
CREATE INDEX ix_human_decision_subject ON human_decision (kind, subject);
"""

GUARDS = """
-- The inserting role is a fact the database states: a row claiming another is refused.
CREATE OR REPLACE FUNCTION triloop_human_decision_recorded_by() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.recorded_by IS DISTINCT FROM current_user THEN
        RAISE EXCEPTION 'human_decision.recorded_by is the inserting role (%), not %',
            current_user, NEW.recorded_by USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER human_decision_recorded_by
    BEFORE INSERT ON human_decision
    FOR EACH ROW EXECUTE FUNCTION triloop_human_decision_recorded_by();

CREATE OR REPLACE FUNCTION triloop_human_decision_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'human_decision is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$;
CREATE TRIGGER human_decision_no_update_delete
    BEFORE UPDATE OR DELETE ON human_decision
    FOR EACH ROW EXECUTE FUNCTION triloop_human_decision_append_only();
CREATE TRIGGER human_decision_no_truncate
    BEFORE TRUNCATE ON human_decision
    FOR EACH STATEMENT EXECUTE FUNCTION triloop_human_decision_append_only();
"""


def upgrade() -> None:
    op.execute(TABLE)
    op.execute(GUARDS)
    op.execute("GRANT SELECT, INSERT ON human_decision TO triloop_web")
    op.execute("GRANT SELECT ON human_decision TO triloop_governance, triloop_learning")


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS human_decision")
    op.execute("DROP FUNCTION IF EXISTS triloop_human_decision_append_only()")
    op.execute("DROP FUNCTION IF EXISTS triloop_human_decision_recorded_by()")
