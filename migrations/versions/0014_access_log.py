"""Reads go to an access log of their own, so the audit chain holds decisions.

Every page view used to add a row to the hash-chained ``audit_event``: 2,180 rows in 15
minutes, mostly reads, burying the decisions an auditor looks for. An allowed ``read`` is
now appended to ``access_event`` instead (a denied read is still a decision and stays in
the chain). ``access_event`` is append-only like the chain: no role may UPDATE, DELETE or
TRUNCATE it (triggers refuse even the owner's statements), each row names the database
role that wrote it, and only the web service reads it back (for auditors, through the API).

Revision ID: 0014
Revises: 0012
Create Date: 2026-12-01
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0014"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ROLES = ("triloop_execution", "triloop_learning", "triloop_governance", "triloop_web")

UP = """
CREATE TABLE access_event (
    id bigserial PRIMARY KEY,
    at timestamptz NOT NULL DEFAULT now(),
    actor jsonb NOT NULL,
    action text NOT NULL CHECK (action <> ''),
    resource jsonb NOT NULL,
    decision_id text,
    policy_revision text,
    db_role text NOT NULL DEFAULT current_user
);
CREATE INDEX access_event_at ON access_event (at);
REVOKE ALL ON access_event FROM PUBLIC;

CREATE OR REPLACE FUNCTION triloop_access_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'access_event is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$;
CREATE TRIGGER access_event_no_update_delete
    BEFORE UPDATE OR DELETE ON access_event
    FOR EACH ROW EXECUTE FUNCTION triloop_access_append_only();
CREATE TRIGGER access_event_no_truncate
    BEFORE TRUNCATE ON access_event
    FOR EACH STATEMENT EXECUTE FUNCTION triloop_access_append_only();

-- The row says which role wrote it, whatever the writer sent.
CREATE OR REPLACE FUNCTION triloop_access_stamp_role() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.db_role := current_user;
    NEW.at := now();
    RETURN NEW;
END;
$$;
CREATE TRIGGER access_event_stamp_role
    BEFORE INSERT ON access_event
    FOR EACH ROW EXECUTE FUNCTION triloop_access_stamp_role();

-- An auditor's filters: by time, by kind, by decision.
CREATE INDEX IF NOT EXISTS audit_event_at ON audit_event (at);
"""


def upgrade() -> None:
    op.execute(UP)
    for role in ROLES:
        op.execute(f"GRANT INSERT ON access_event TO {role}")
        op.execute(f"GRANT USAGE ON SEQUENCE access_event_id_seq TO {role}")
    op.execute("GRANT SELECT ON access_event TO triloop_web")


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS access_event")
    op.execute("DROP FUNCTION IF EXISTS triloop_access_append_only()")
    op.execute("DROP FUNCTION IF EXISTS triloop_access_stamp_role()")
    op.execute("DROP INDEX IF EXISTS audit_event_at")
