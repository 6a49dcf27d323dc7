"""The audit log gets one way in: a SECURITY DEFINER function that stamps the real role.

Service roles lose INSERT on ``audit_event``. An append calls ``triloop_audit_head()``,
which locks the chain head (a row of ``audit_chain_head``, a table no service role may
touch, so none can hold the lock and stall everyone else; the wait is bounded by
``lock_timeout``) and returns the head with ``session_user``, the role that logged in.
The writer hashes the new row, ``db_role`` included, and calls ``triloop_audit_append``,
which refuses a ``db_role`` other than ``session_user`` or a row that does not extend the
head. ``triloop audit verify`` then checks each row's actor against its role.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ROLES = ("triloop_execution", "triloop_learning", "triloop_governance", "triloop_web")
LOCK_TIMEOUT = "5s"

UPGRADE = f"""
ALTER TABLE audit_event ADD COLUMN db_role text;

CREATE TABLE audit_chain_head (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    seq bigint NOT NULL,
    hash text NOT NULL
);
INSERT INTO audit_chain_head (seq, hash)
SELECT COALESCE(max(seq), 0),
       COALESCE((SELECT hash FROM audit_event ORDER BY seq DESC LIMIT 1), repeat('0', 64))
FROM audit_event;
REVOKE ALL ON audit_chain_head FROM PUBLIC;

-- Every insert extends the head and moves it; the row lock on the head serialises writers.
CREATE OR REPLACE FUNCTION triloop_audit_extends_head() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public AS $$
DECLARE
    head audit_chain_head%ROWTYPE;
BEGIN
    SELECT * INTO head FROM audit_chain_head FOR UPDATE;
    IF NEW.seq <> head.seq + 1 OR NEW.prev_hash <> head.hash THEN
        RAISE EXCEPTION 'audit_event insert does not extend the chain head (seq %, expected %)',
            NEW.seq, head.seq + 1 USING ERRCODE = 'serialization_failure';
    END IF;
    UPDATE audit_chain_head SET seq = NEW.seq, hash = NEW.hash;
    RETURN NEW;
END;
$$;

CREATE OR REPLACE FUNCTION triloop_audit_head(OUT seq bigint, OUT hash text, OUT db_role text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public SET lock_timeout = '{LOCK_TIMEOUT}'
AS $$
BEGIN
    SELECT h.seq, h.hash INTO seq, hash FROM audit_chain_head h FOR UPDATE;
    db_role := session_user;
END;
$$;

CREATE OR REPLACE FUNCTION triloop_audit_append(
    p_seq bigint, p_at timestamptz, p_actor jsonb, p_action text, p_resource jsonb,
    p_decision text, p_decision_id text, p_policy_revision text, p_payload jsonb,
    p_prev_hash text, p_hash text, p_db_role text
) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public SET lock_timeout = '{LOCK_TIMEOUT}'
AS $$
BEGIN
    IF p_db_role IS DISTINCT FROM session_user THEN
        RAISE EXCEPTION 'an audit row states the role that wrote it: %, not %',
            session_user, p_db_role USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF p_action = '' OR p_decision NOT IN ('allow', 'deny', 'record') THEN
        RAISE EXCEPTION 'an audit row needs an action and a decision (allow, deny, record)'
            USING ERRCODE = 'check_violation';
    END IF;
    INSERT INTO audit_event (seq, at, actor, action, resource, decision, decision_id,
                             policy_revision, payload, prev_hash, hash, db_role)
    VALUES (p_seq, p_at, p_actor, p_action, p_resource, p_decision, p_decision_id,
            p_policy_revision, p_payload, p_prev_hash, p_hash, session_user);
END;
$$;

REVOKE ALL ON FUNCTION triloop_audit_head() FROM PUBLIC;
REVOKE ALL ON FUNCTION triloop_audit_append(bigint, timestamptz, jsonb, text, jsonb, text, text,
                                            text, jsonb, text, text, text) FROM PUBLIC;
"""


def upgrade() -> None:
    op.execute(UPGRADE)
    for role in ROLES:
        op.execute(f"REVOKE INSERT ON audit_event FROM {role}")
        op.execute(f"GRANT EXECUTE ON FUNCTION triloop_audit_head() TO {role}")
        op.execute(f"GRANT EXECUTE ON FUNCTION triloop_audit_append(bigint, timestamptz, jsonb,"
                   f" text, jsonb, text, text, text, jsonb, text, text, text) TO {role}")


def downgrade() -> None:
    op.execute("DROP FUNCTION IF EXISTS triloop_audit_append(bigint, timestamptz, jsonb, text,"
               " jsonb, text, text, text, jsonb, text, text, text)")
    op.execute("DROP FUNCTION IF EXISTS triloop_audit_head()")
    op.execute("""
CREATE OR REPLACE FUNCTION triloop_audit_extends_head() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    head_seq bigint;
    head_hash text;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('triloop.audit_event'));
    SELECT seq, hash INTO head_seq, head_hash FROM audit_event ORDER BY seq DESC LIMIT 1;
    IF head_seq IS NULL THEN
        head_seq := 0;
        head_hash := repeat('0', 64);
    END IF;
    IF NEW.seq <> head_seq + 1 OR NEW.prev_hash <> head_hash THEN
        RAISE EXCEPTION 'audit_event insert does not extend the chain head (seq %, expected %)',
            NEW.seq, head_seq + 1 USING ERRCODE = 'serialization_failure';
    END IF;
    RETURN NEW;
END;
$$;""")
    op.execute("DROP TABLE IF EXISTS audit_chain_head")
    op.execute("ALTER TABLE audit_event DROP COLUMN IF EXISTS db_role")
    for role in ROLES:
        op.execute(f"GRANT INSERT ON audit_event TO {role}")
