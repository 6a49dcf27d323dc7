"""Learning trains only on held-out tasks, and cannot read or forge what judges it.

Training on held-out tasks (issue 32, item 6):

- ``rollout_batch.task_ids`` records the tasks a batch was asked for (execution's Nexus
  handler writes it when it admits a request).
- ``triloop_held_out_conflicts(task_ids)`` names each asked task that is, in truth, a
  held-out one: a task of any frozen eval set, or of production traffic (a task some
  production, shadow or canary episode played). Two tasks are the same when they share an
  id, or the same environment and seed under any version (as in ``triloop/held_out.py``).
  SECURITY DEFINER: it reads eval sets and every episode, whoever asks.
- Triggers refuse a training ``rollout_batch`` or a training ``trajectory`` that a service
  role inserts on such a task. Execution's handler asks OPA first (and audits the refusal);
  the triggers hold when that code is skipped. The owner (set-up) is not limited.

What judges learning is out of its sight (issue 32, item 7):

- ``triloop_learning`` loses SELECT on ``gate_result`` (threshold specs, eval aggregates),
  ``audit_event`` (payloads), ``approval``, ``promotion``, ``routing``, ``deployment`` and
  ``deployment_history``; the learning worker reads none of them (it appends to the audit
  log through the SECURITY DEFINER functions of 0006).
- Row-level security: on ``rollout_batch`` learning sees training batches only (eval batch
  ids stay governance's; governance, the web service, execution and the verifier see every
  batch); on ``human_decision`` it sees run controls only (the decisions it
  carries out), not audits, approvals or overrides.
- ``access_event`` gets one way in, ``triloop_access_append`` (SECURITY DEFINER), which
  stamps ``db_role`` with the role that logged in; no role may INSERT directly.
- A trigger refuses a ``proposal`` whose checkpoint is not the proposing run's: written by
  that run, or the base model (a root) the run's own training batches were served from
  (an iteration without learning signal keeps its parent's weights and id).

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-01
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ROLES = ("triloop_execution", "triloop_learning", "triloop_governance", "triloop_web")
SERVICE_ROLES = ", ".join(f"'{role}'" for role in ROLES)
OTHERS = "triloop_execution, triloop_governance, triloop_web"
# What learning must not read: the gates' evidence, the audit log, and the release path.
JUDGING = ("gate_result", "audit_event", "approval", "promotion", "routing", "deployment",
           "deployment_history")

HELD_OUT = f"""
ALTER TABLE rollout_batch ADD COLUMN task_ids text[];
-- Asked at every training episode: is this task in an eval set, or in production traffic?
-- (A training task's own episodes would otherwise be scanned each time.)
CREATE INDEX eval_item_task_id ON eval_item (task_id);
CREATE INDEX trajectory_traffic_task_id ON trajectory (task_id)
    WHERE purpose IN ('production', 'shadow', 'canary');

-- Each asked task that shares an id, or an environment and seed, with a held-out task.
CREATE OR REPLACE FUNCTION triloop_held_out_conflicts(p_tasks text[])
RETURNS TABLE (task_id text, held_task text, environment text, seed integer, held_by text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public AS $$
    WITH asked AS (
        SELECT t.id, v.environment_name, t.seed FROM task t
        JOIN environment_version v ON v.id = t.environment_version_id
        WHERE t.id = ANY(p_tasks)
    ), same_world AS (
        SELECT a.id AS task_id, o.id AS twin, a.environment_name, a.seed FROM asked a
        JOIN environment_version ov ON ov.environment_name = a.environment_name
        JOIN task o ON o.environment_version_id = ov.id AND o.seed = a.seed
    )
    SELECT w.task_id, w.twin, w.environment_name, w.seed,
           'frozen eval set ' || s.name || ' v' || s.version
    FROM same_world w JOIN eval_item i ON i.task_id = w.twin
    JOIN eval_set s ON s.id = i.eval_set_id AND s.frozen_at IS NOT NULL
    UNION
    SELECT w.task_id, w.twin, w.environment_name, w.seed, 'production traffic'
    FROM same_world w WHERE EXISTS (
        SELECT 1 FROM trajectory p WHERE p.task_id = w.twin
        AND p.purpose IN ('production', 'shadow', 'canary'))
    ORDER BY 1, 2, 5
$$;
REVOKE ALL ON FUNCTION triloop_held_out_conflicts(text[]) FROM PUBLIC;
-- The roles that insert rollout batches (governance its own since 0021); never learning,
-- which would learn from it which tasks are held out.
GRANT EXECUTE ON FUNCTION triloop_held_out_conflicts(text[]) TO triloop_execution,
    triloop_web, triloop_governance;

-- Raise naming every conflict of these tasks, if any (the caller's statement fails).
CREATE OR REPLACE FUNCTION triloop_refuse_held_out(p_what text, p_tasks text[])
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    found text;
BEGIN
    SELECT string_agg(format('task %s is %s (%s seed %s, in %s)', c.task_id,
                             CASE WHEN c.task_id = c.held_task THEN 'held out'
                                  ELSE 'the same world as held-out task ' || c.held_task END,
                             c.environment, c.seed, c.held_by), '; ')
    INTO found FROM triloop_held_out_conflicts(p_tasks) c;
    IF found IS NOT NULL THEN
        RAISE EXCEPTION '%: training must stay off eval and production-traffic tasks; %',
            p_what, found USING ERRCODE = 'insufficient_privilege';
    END IF;
END;
$$;
REVOKE ALL ON FUNCTION triloop_refuse_held_out(text, text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION triloop_refuse_held_out(text, text[]) TO triloop_execution,
    triloop_web, triloop_governance;

CREATE OR REPLACE FUNCTION triloop_rollout_batch_held_out() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.purpose = 'training' AND current_user IN ({SERVICE_ROLES}) THEN
        PERFORM triloop_refuse_held_out('training batch ' || NEW.id,
                                        COALESCE(NEW.task_ids, '{{}}'));
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER rollout_batch_held_out
    BEFORE INSERT ON rollout_batch
    FOR EACH ROW EXECUTE FUNCTION triloop_rollout_batch_held_out();

CREATE OR REPLACE FUNCTION triloop_trajectory_held_out() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.purpose = 'training' AND current_user IN ({SERVICE_ROLES}) THEN
        PERFORM triloop_refuse_held_out('training episode ' || NEW.id, ARRAY[NEW.task_id]);
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER trajectory_held_out
    BEFORE INSERT ON trajectory
    FOR EACH ROW EXECUTE FUNCTION triloop_trajectory_held_out();
"""

BLIND = f"""
ALTER TABLE rollout_batch ENABLE ROW LEVEL SECURITY;
CREATE POLICY rollout_batch_learning_training_only ON rollout_batch FOR SELECT
    TO triloop_learning USING (purpose = 'training');
CREATE POLICY rollout_batch_other_services ON rollout_batch TO {OTHERS}
    USING (true) WITH CHECK (true);
-- The verifier (0021) reads every batch's plan to replay its episodes; it writes none.
CREATE POLICY rollout_batch_verifier_reads ON rollout_batch FOR SELECT
    TO triloop_verifier USING (true);

ALTER TABLE human_decision ENABLE ROW LEVEL SECURITY;
CREATE POLICY human_decision_learning_run_controls ON human_decision FOR SELECT
    TO triloop_learning USING (kind = 'run_control');
CREATE POLICY human_decision_other_services ON human_decision TO {OTHERS}
    USING (true) WITH CHECK (true);

-- A proposal names a checkpoint of its own run (or the base its training started from).
CREATE OR REPLACE FUNCTION triloop_proposal_own_checkpoint() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    written_by text;
    root boolean;
BEGIN
    IF current_user IN ({SERVICE_ROLES}) THEN
        SELECT c.run_id, c.parent_id IS NULL AND c.run_id IS NULL INTO written_by, root
        FROM checkpoint c WHERE c.id = NEW.checkpoint_id;
        IF written_by IS DISTINCT FROM NEW.run_id AND NOT (COALESCE(root, false) AND EXISTS (
                SELECT 1 FROM rollout_batch b WHERE b.run_id = NEW.run_id
                AND b.purpose = 'training' AND b.checkpoint_id = NEW.checkpoint_id)) THEN
            RAISE EXCEPTION 'proposal %: checkpoint % belongs to run %, not to the proposing'
                ' run %; a run proposes only its own checkpoints', NEW.id, NEW.checkpoint_id,
                COALESCE(written_by, '(none)'), NEW.run_id
                USING ERRCODE = 'insufficient_privilege';
        END IF;
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER proposal_own_checkpoint
    BEFORE INSERT OR UPDATE ON proposal
    FOR EACH ROW EXECUTE FUNCTION triloop_proposal_own_checkpoint();

-- Inside the append function the current user is the owner: stamp the role that logged in.
CREATE OR REPLACE FUNCTION triloop_access_stamp_role() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.db_role := session_user;
    NEW.at := now();
    RETURN NEW;
END;
$$;

CREATE OR REPLACE FUNCTION triloop_access_append(
    p_actor jsonb, p_action text, p_resource jsonb, p_decision_id text,
    p_policy_revision text
) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public AS $$
BEGIN
    INSERT INTO access_event (actor, action, resource, decision_id, policy_revision)
    VALUES (p_actor, p_action, p_resource, p_decision_id, p_policy_revision);
END;
$$;
REVOKE ALL ON FUNCTION triloop_access_append(jsonb, text, jsonb, text, text) FROM PUBLIC;
"""

DOWN = f"""
DROP FUNCTION IF EXISTS triloop_access_append(jsonb, text, jsonb, text, text);
CREATE OR REPLACE FUNCTION triloop_access_stamp_role() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.db_role := current_user;
    NEW.at := now();
    RETURN NEW;
END;
$$;
DROP TRIGGER IF EXISTS proposal_own_checkpoint ON proposal;
DROP FUNCTION IF EXISTS triloop_proposal_own_checkpoint();
DROP POLICY IF EXISTS human_decision_other_services ON human_decision;
DROP POLICY IF EXISTS human_decision_learning_run_controls ON human_decision;
ALTER TABLE human_decision DISABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS rollout_batch_verifier_reads ON rollout_batch;
DROP POLICY IF EXISTS rollout_batch_other_services ON rollout_batch;
DROP POLICY IF EXISTS rollout_batch_learning_training_only ON rollout_batch;
ALTER TABLE rollout_batch DISABLE ROW LEVEL SECURITY;
DROP TRIGGER IF EXISTS trajectory_held_out ON trajectory;
DROP FUNCTION IF EXISTS triloop_trajectory_held_out();
DROP TRIGGER IF EXISTS rollout_batch_held_out ON rollout_batch;
DROP FUNCTION IF EXISTS triloop_rollout_batch_held_out();
DROP FUNCTION IF EXISTS triloop_refuse_held_out(text, text[]);
DROP FUNCTION IF EXISTS triloop_held_out_conflicts(text[]);
DROP INDEX IF EXISTS trajectory_traffic_task_id;
DROP INDEX IF EXISTS eval_item_task_id;
ALTER TABLE rollout_batch DROP COLUMN IF EXISTS task_ids;
GRANT SELECT ON {", ".join(JUDGING)} TO triloop_learning;
"""


def upgrade() -> None:
    op.execute(HELD_OUT)
    op.execute(BLIND)
    op.execute(f"REVOKE SELECT ON {', '.join(JUDGING)} FROM triloop_learning")
    for role in ROLES:
        op.execute(f"REVOKE INSERT ON access_event FROM {role}")
        op.execute(f"REVOKE USAGE ON SEQUENCE access_event_id_seq FROM {role}")
        op.execute("GRANT EXECUTE ON FUNCTION triloop_access_append(jsonb, text, jsonb, text,"
                   f" text) TO {role}")


def downgrade() -> None:
    op.execute(DOWN)
    for role in ROLES:
        op.execute(f"GRANT INSERT ON access_event TO {role}")
        op.execute(f"GRANT USAGE ON SEQUENCE access_event_id_seq TO {role}")
