"""Evidence the gates count: planned episodes, and each requester vouches for itself.

Planned episodes. A ``rollout_batch`` row names the episodes its requester asked for
(``planned_episodes``: episode id -> task and seed, ``triloop.episode_plan``). A trajectory
the execution role writes must be one of them, for the planned task (a production
episode's shadow is ``<planned id>:shadow``); the id is the trajectory's key, so each at
most once. A forged row outside the plan is refused here, not left for the gates to find.

Who vouches. Each requester writes its own batch row under its own role: governance its
eval batches (before it calls execution's Nexus handler, which only reads the row), the
web service people's production traffic. Execution records only what it alone receives:
learning's training batches, from the caller its Nexus handler proves. Execution can no
longer write a row saying governance (or the web service) asked.

Revision ID: 0021
Revises: 0019
Create Date: 2026-12-01
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0021"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PLAN = """
ALTER TABLE rollout_batch ADD COLUMN planned_episodes jsonb
    CHECK (planned_episodes IS NULL OR jsonb_typeof(planned_episodes) = 'object');
"""

REQUESTERS = """
-- Each service role vouches for itself only: web for people's production traffic,
-- governance for its own batches, execution for the training batches learning asked its
-- Nexus handler for. Every such row names its planned episodes. The owner (set-up) is not
-- limited.
CREATE OR REPLACE FUNCTION triloop_rollout_batch_requester() RETURNS trigger
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
    IF current_user = 'triloop_governance'
       AND (NEW.requested_by <> 'governance' OR NEW.purpose IN ('training', 'production')) THEN
        RAISE EXCEPTION 'governance records the % batches it asks for itself, not a % batch'
            ' for %', 'eval, shadow, canary and probe', NEW.purpose, NEW.requested_by
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF current_user = 'triloop_execution'
       AND (NEW.requested_by <> 'learning' OR NEW.purpose <> 'training') THEN
        RAISE EXCEPTION 'the execution loop records only the training batches learning asked'
            ' its Nexus handler for, not a % batch for %: governance and the web service'
            ' record their own', NEW.purpose, NEW.requested_by
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF current_user IN ('triloop_web', 'triloop_governance', 'triloop_execution')
       AND (NEW.planned_episodes IS NULL OR NEW.planned_episodes = '{}'::jsonb) THEN
        RAISE EXCEPTION 'rollout_batch %: a batch names the episodes it plans'
            ' (planned_episodes)', NEW.id USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END;
$$;
DROP TRIGGER rollout_batch_vouched ON rollout_batch;
CREATE TRIGGER rollout_batch_requester
    BEFORE INSERT ON rollout_batch
    FOR EACH ROW EXECUTE FUNCTION triloop_rollout_batch_requester();

-- A trajectory the execution role writes is an episode its batch planned, for the planned
-- task. Fires after ``trajectory_in_requested_batch`` (names sort), which refuses a batch
-- nobody requested.
CREATE OR REPLACE FUNCTION triloop_trajectory_planned() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    plan jsonb;
    planned text := NEW.id;
BEGIN
    IF current_user <> 'triloop_execution' THEN
        RETURN NEW;
    END IF;
    SELECT planned_episodes INTO plan FROM rollout_batch WHERE id = NEW.batch_id;
    IF NEW.purpose = 'shadow' THEN
        planned := regexp_replace(NEW.id, '[:]shadow$', '');
        IF planned = NEW.id THEN
            RAISE EXCEPTION 'trajectory %: a shadow episode is <planned episode>%shadow',
                NEW.id, ':' USING ERRCODE = 'insufficient_privilege';
        END IF;
    END IF;
    IF plan IS NULL OR NOT plan ? planned THEN
        RAISE EXCEPTION 'trajectory %: not an episode batch % planned', NEW.id, NEW.batch_id
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF plan -> planned ->> 'task_id' IS DISTINCT FROM NEW.task_id THEN
        RAISE EXCEPTION 'trajectory %: batch % planned it on task %, not %', NEW.id,
            NEW.batch_id, plan -> planned ->> 'task_id', NEW.task_id
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER trajectory_planned
    BEFORE INSERT ON trajectory
    FOR EACH ROW EXECUTE FUNCTION triloop_trajectory_planned();
"""


def upgrade() -> None:
    op.execute(PLAN)
    op.execute(REQUESTERS)
    op.execute("GRANT INSERT ON rollout_batch TO triloop_governance")


def downgrade() -> None:
    op.execute("REVOKE INSERT ON rollout_batch FROM triloop_governance")
    op.execute("DROP TRIGGER IF EXISTS trajectory_planned ON trajectory")
    op.execute("DROP FUNCTION IF EXISTS triloop_trajectory_planned()")
    op.execute("DROP TRIGGER IF EXISTS rollout_batch_requester ON rollout_batch")
    op.execute("DROP FUNCTION IF EXISTS triloop_rollout_batch_requester()")
    op.execute("CREATE TRIGGER rollout_batch_vouched BEFORE INSERT ON rollout_batch "
               "FOR EACH ROW EXECUTE FUNCTION triloop_rollout_batch_vouched()")
    op.execute("ALTER TABLE rollout_batch DROP COLUMN IF EXISTS planned_episodes")
