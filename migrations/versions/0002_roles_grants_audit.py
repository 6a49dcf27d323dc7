"""Per-loop database roles, GRANTs that mirror the policy, append-only audit log.

The GRANTs are the third enforcement layer (after Temporal task queues and OPA):
even a code path that skips ``authorize()`` cannot write what its role may not.
The learning role cannot even read eval sets, items or thresholds, so held-out
data can never leak into training.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ROLES = ("triloop_execution", "triloop_learning", "triloop_governance", "triloop_web")

ALL_TABLES = (
    "app_user", "approval", "audit_event", "checkpoint", "deployment", "deployment_history",
    "environment", "environment_version", "eval_item", "eval_set", "gate_result", "promotion",
    "proposal", "routing", "step", "task", "threshold", "training_run", "training_step",
    "trajectory",
)
EVAL_TABLES = ("eval_set", "eval_item", "threshold")

# role -> list of GRANT clauses (privileges ON table); SELECT and audit INSERT come below.
WRITES: dict[str, list[str]] = {
    "triloop_execution": [
        "INSERT ON trajectory",
        "INSERT ON step",
    ],
    "triloop_learning": [
        "INSERT ON checkpoint",
        "INSERT, UPDATE ON training_step",
        "INSERT ON proposal",
        "UPDATE (status, status_reason, iterations_done, updated_at) ON training_run",
    ],
    "triloop_governance": [
        "INSERT ON environment",
        "INSERT ON environment_version",
        "UPDATE (retired_at, retired_by) ON environment_version",
        "INSERT ON task",
        "UPDATE (status, evidence, decided_by, decided_at) ON task",
        "INSERT ON eval_set",
        "UPDATE (content_hash, frozen_at) ON eval_set",
        "INSERT, DELETE ON eval_item",
        "INSERT ON threshold",
        "INSERT, UPDATE ON promotion",
        "INSERT ON gate_result",
        "INSERT ON approval",
        "INSERT, UPDATE ON deployment",
        "INSERT ON deployment_history",
        "INSERT, UPDATE ON routing",
    ],
    "triloop_web": [
        "INSERT, UPDATE ON app_user",
        "INSERT ON training_run",
        "UPDATE (workflow_id, status, status_reason, updated_at) ON training_run",
    ],
}

AUDIT_GUARD = """
CREATE OR REPLACE FUNCTION triloop_audit_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_event is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$;

CREATE TRIGGER audit_event_no_update_delete
    BEFORE UPDATE OR DELETE ON audit_event
    FOR EACH ROW EXECUTE FUNCTION triloop_audit_append_only();
CREATE TRIGGER audit_event_no_truncate
    BEFORE TRUNCATE ON audit_event
    FOR EACH STATEMENT EXECUTE FUNCTION triloop_audit_append_only();

-- Every insert must extend the current head of the chain: a writer that skipped
-- the chain lock, or raced another, is refused instead of forking the chain.
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
$$;

CREATE TRIGGER audit_event_extends_head
    BEFORE INSERT ON audit_event
    FOR EACH ROW EXECUTE FUNCTION triloop_audit_extends_head();
"""

FROZEN_GUARD = """
-- A frozen eval set never changes: its items are fixed, and so is the set row.
CREATE OR REPLACE FUNCTION triloop_eval_item_frozen() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    target text := COALESCE(NEW.eval_set_id, OLD.eval_set_id);
BEGIN
    IF EXISTS (SELECT 1 FROM eval_set WHERE id = target AND frozen_at IS NOT NULL) THEN
        RAISE EXCEPTION 'eval set % is frozen; create a new version instead', target
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN COALESCE(NEW, OLD);
END;
$$;
CREATE TRIGGER eval_item_frozen
    BEFORE INSERT OR UPDATE OR DELETE ON eval_item
    FOR EACH ROW EXECUTE FUNCTION triloop_eval_item_frozen();

CREATE OR REPLACE FUNCTION triloop_eval_set_frozen() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.frozen_at IS NOT NULL THEN
        RAISE EXCEPTION 'eval set % is frozen; create a new version instead', OLD.id
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER eval_set_frozen
    BEFORE UPDATE OR DELETE ON eval_set
    FOR EACH ROW EXECUTE FUNCTION triloop_eval_set_frozen();
"""


def upgrade() -> None:
    for role in ROLES:
        op.execute(
            f"DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{role}') "
            f"THEN CREATE ROLE {role} LOGIN; END IF; END $$;"
        )
        op.execute(f"GRANT CONNECT ON DATABASE {_current_db()} TO {role}")
        op.execute(f"GRANT USAGE ON SCHEMA public TO {role}")
        readable = [t for t in ALL_TABLES if role != "triloop_learning" or t not in EVAL_TABLES]
        op.execute(f"GRANT SELECT ON {', '.join(readable)} TO {role}")
        op.execute(f"GRANT INSERT ON audit_event TO {role}")
        op.execute(f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {role}")
        for clause in WRITES[role]:
            privileges, table = clause.rsplit(" ON ", 1)
            op.execute(f"GRANT {privileges} ON {table} TO {role}")
    op.execute(AUDIT_GUARD)
    op.execute(FROZEN_GUARD)


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS eval_set_frozen ON eval_set")
    op.execute("DROP TRIGGER IF EXISTS eval_item_frozen ON eval_item")
    op.execute("DROP FUNCTION IF EXISTS triloop_eval_set_frozen()")
    op.execute("DROP FUNCTION IF EXISTS triloop_eval_item_frozen()")
    op.execute("DROP TRIGGER IF EXISTS audit_event_extends_head ON audit_event")
    op.execute("DROP TRIGGER IF EXISTS audit_event_no_truncate ON audit_event")
    op.execute("DROP TRIGGER IF EXISTS audit_event_no_update_delete ON audit_event")
    op.execute("DROP FUNCTION IF EXISTS triloop_audit_extends_head()")
    op.execute("DROP FUNCTION IF EXISTS triloop_audit_append_only()")
    for role in ROLES:
        # Roles are cluster-wide: revoke here; drop only when no other database uses them.
        op.execute(f"REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {role}")
        op.execute(f"REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM {role}")
        op.execute(f"REVOKE ALL ON SCHEMA public FROM {role}")
        op.execute(f"REVOKE ALL ON DATABASE {_current_db()} FROM {role}")


def _current_db() -> str:
    name = op.get_bind().exec_driver_sql("SELECT current_database()").scalar_one()
    return f'"{name}"'
