"""Rollout batches vouched for by the database: who asked for each batch, and only those.

A ``rollout_batch`` row records what a batch was asked for (purpose, checkpoint, run)
and which loop asked. The execution loop writes it when its Nexus handler admits a
request (the caller is the namespace the Temporal server named), the web service for the
production traffic people start. The database stamps the inserting role and refuses a
requester that role cannot vouch for; rows never change. A trajectory the execution role
writes must belong to such a batch, with the batch's purpose (production batches also
carry their shadow and canary episodes) and, where the batch names one, its checkpoint.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-30
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE = """
CREATE TABLE rollout_batch (
    id text PRIMARY KEY CHECK (id <> ''),
    purpose text NOT NULL
        CHECK (purpose IN ('training', 'eval', 'production', 'shadow', 'canary', 'probe')),
    checkpoint_id text,
    run_id text,
    requested_by text NOT NULL CHECK (requested_by IN ('learning', 'governance', 'web')),
    recorded_by text NOT NULL DEFAULT current_user,
    created_at timestamptz NOT NULL DEFAULT now()
);
"""

GUARDS = """
-- Who may vouch for which requester: execution for the loops whose Nexus requests it
-- admitted, web for people's production traffic. The owner (set-up) is not limited.
CREATE OR REPLACE FUNCTION triloop_rollout_batch_vouched() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.recorded_by IS DISTINCT FROM current_user THEN
        RAISE EXCEPTION 'rollout_batch.recorded_by is the inserting role (%), not %',
            current_user, NEW.recorded_by USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF current_user = 'triloop_web'
       AND (NEW.requested_by <> 'web' OR NEW.purpose <> 'production') THEN
        RAISE EXCEPTION 'the web service records production batches people asked for, not a'
            ' % batch for %', NEW.purpose, NEW.requested_by
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF current_user = 'triloop_execution' AND NEW.requested_by NOT IN ('learning', 'governance')
    THEN
        RAISE EXCEPTION 'the execution loop records batches other loops asked for, not %',
            NEW.requested_by USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF current_user = 'triloop_execution' AND NEW.requested_by = 'learning'
       AND NEW.purpose <> 'training' THEN
        RAISE EXCEPTION 'learning asks for training batches only, not %', NEW.purpose
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER rollout_batch_vouched
    BEFORE INSERT ON rollout_batch
    FOR EACH ROW EXECUTE FUNCTION triloop_rollout_batch_vouched();

CREATE OR REPLACE FUNCTION triloop_rollout_batch_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'rollout_batch is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$;
CREATE TRIGGER rollout_batch_no_update_delete
    BEFORE UPDATE OR DELETE ON rollout_batch
    FOR EACH ROW EXECUTE FUNCTION triloop_rollout_batch_append_only();
CREATE TRIGGER rollout_batch_no_truncate
    BEFORE TRUNCATE ON rollout_batch
    FOR EACH STATEMENT EXECUTE FUNCTION triloop_rollout_batch_append_only();

-- A trajectory the execution role writes belongs to a batch somebody asked for, and is
-- what that batch was asked for.
CREATE OR REPLACE FUNCTION triloop_trajectory_in_requested_batch() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    batch rollout_batch%ROWTYPE;
BEGIN
    IF current_user <> 'triloop_execution' THEN
        RETURN NEW;
    END IF;
    SELECT * INTO batch FROM rollout_batch WHERE id = NEW.batch_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'trajectory %: batch % was never requested', NEW.id, NEW.batch_id
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF NOT (NEW.purpose = batch.purpose OR (batch.purpose = 'production'
            AND NEW.purpose IN ('shadow', 'canary'))) THEN
        RAISE EXCEPTION 'trajectory %: a % episode in % batch %', NEW.id, NEW.purpose,
            batch.purpose, batch.id USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF batch.checkpoint_id IS NOT NULL AND NEW.checkpoint_id IS DISTINCT FROM batch.checkpoint_id
    THEN
        RAISE EXCEPTION 'trajectory %: served by %, but batch % asked for %', NEW.id,
            NEW.checkpoint_id, batch.id, batch.checkpoint_id
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER trajectory_in_requested_batch
    BEFORE INSERT ON trajectory
    FOR EACH ROW EXECUTE FUNCTION triloop_trajectory_in_requested_batch();
"""


def upgrade() -> None:
    op.execute(TABLE)
    op.execute(GUARDS)
    op.execute("GRANT SELECT, INSERT ON rollout_batch TO triloop_execution, triloop_web")
    op.execute("GRANT SELECT ON rollout_batch TO triloop_governance, triloop_learning")


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS trajectory_in_requested_batch ON trajectory")
    op.execute("DROP FUNCTION IF EXISTS triloop_trajectory_in_requested_batch()")
    op.execute("DROP TABLE IF EXISTS rollout_batch")
    op.execute("DROP FUNCTION IF EXISTS triloop_rollout_batch_append_only()")
    op.execute("DROP FUNCTION IF EXISTS triloop_rollout_batch_vouched()")
