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

An independent verdict. ``triloop_verifier``, a role of its own (its own password, its own
process: ``verifier/``), replays each stored eval, shadow, canary and production episode in
a fresh environment of the pinned version and writes its verdict to ``verdict``. Only that
role may insert there; the database stamps the role; rows never change. The gates count the
verifier's verdicts for those episodes, never execution's own ``success``/``total_reward``.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-01
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
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


VERIFIER = "triloop_verifier"
# What the verifier reads to replay an episode: the batch's plan, the stored episode and its
# steps, the task and its pinned environment version.
VERIFIER_READS = ("rollout_batch", "trajectory", "step", "task", "environment_version",
                  "environment", "verdict")
# It audits a verdict that contradicts execution's row, in one call (0020).
AUDIT_LOG = "triloop_audit_log(jsonb, text, jsonb, text, text, text, jsonb, text)"
SERVICE_ROLES = ("triloop_execution", "triloop_learning", "triloop_governance", "triloop_web")


def _role_list(roles: Sequence[str]) -> str:
    return ", ".join(f"'{role}'" for role in roles)


def _audit_rules(roles: Sequence[str]) -> str:
    """0020's rules on who writes which actor, and whose hold on the chain head is ended,
    for these service roles: each may name only its own service (``triloop_<service>``).
    A role left out would be judged as the owner is, not at all."""
    role_list = _role_list(roles)
    return f"""
CREATE OR REPLACE FUNCTION triloop_audit_actor_check(p_actor jsonb, p_credential text)
RETURNS void LANGUAGE plpgsql STABLE SET search_path = public AS $$
DECLARE
    service text := p_actor ->> 'service';
    person text := p_actor ->> 'user';
    claimed text[];
BEGIN
    IF session_user NOT IN ({role_list}) THEN
        RETURN;  -- the owner (set-up, tests) is not judged here
    END IF;
    IF 'triloop_' || coalesce(service, '') <> session_user THEN
        RAISE EXCEPTION 'database role % writes only its own service''s events, not %',
            session_user, coalesce(service, '(none)') USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF person IS NULL THEN
        RETURN;
    END IF;
    IF session_user <> 'triloop_web' THEN
        RAISE EXCEPTION 'only the web service names a person as the actor; % may not name %',
            session_user, person USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF triloop_person_of(p_credential) IS DISTINCT FROM person THEN
        RAISE EXCEPTION 'the credential of this request is not %''s', person
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    claimed := ARRAY(SELECT jsonb_array_elements_text(coalesce(p_actor -> 'roles', '[]')));
    IF NOT claimed <@ (SELECT roles FROM app_user WHERE name = person) THEN
        RAISE EXCEPTION '% does not hold every role the event names (%)', person, claimed
            USING ERRCODE = 'insufficient_privilege';
    END IF;
END;
$$;
REVOKE ALL ON FUNCTION triloop_audit_actor_check(jsonb, text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION triloop_audit_end_head_holder() RETURNS void
LANGUAGE plpgsql SET search_path = public AS $$
DECLARE
    locker xid := (SELECT xmax FROM audit_chain_head);
    holder integer;
BEGIN
    SELECT l.pid INTO holder FROM pg_locks l
        WHERE l.locktype = 'transactionid' AND l.granted AND l.transactionid = locker
          AND l.pid <> pg_backend_pid();
    IF holder IS NULL THEN
        SELECT a.pid INTO holder FROM pg_stat_activity a
            WHERE a.pid <> pg_backend_pid() AND a.backend_xid IS NOT NULL
              AND a.usename IN ({role_list})
              AND a.backend_xid::text::bigint <= locker::text::bigint
              AND a.xact_start <= clock_timestamp() - interval '5s'
            ORDER BY a.backend_xid::text::bigint DESC LIMIT 1;
    END IF;
    IF holder IS NOT NULL THEN
        RAISE WARNING 'ending backend %: it held the audit chain head past lock_timeout',
            holder;
        PERFORM pg_terminate_backend(holder, 5000);
    END IF;
END;
$$;
REVOKE ALL ON FUNCTION triloop_audit_end_head_holder() FROM PUBLIC;
"""


VERDICT = """
CREATE TABLE verdict (
    trajectory_id text PRIMARY KEY REFERENCES trajectory (id),
    batch_id text NOT NULL,
    success boolean NOT NULL,
    total_reward double precision NOT NULL,
    -- Whether execution's own row said the same (success and total reward).
    agrees boolean NOT NULL,
    details jsonb NOT NULL DEFAULT '{}',
    recorded_by text NOT NULL DEFAULT current_user,
    created_at timestamptz NOT NULL DEFAULT now()
);
REVOKE ALL ON verdict FROM PUBLIC;

CREATE OR REPLACE FUNCTION triloop_verdict_stamped() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.recorded_by IS DISTINCT FROM current_user THEN
        RAISE EXCEPTION 'verdict.recorded_by is the inserting role (%), not %',
            current_user, NEW.recorded_by USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER verdict_stamped
    BEFORE INSERT ON verdict
    FOR EACH ROW EXECUTE FUNCTION triloop_verdict_stamped();

CREATE OR REPLACE FUNCTION triloop_verdict_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'verdict is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$;
CREATE TRIGGER verdict_no_update_delete
    BEFORE UPDATE OR DELETE ON verdict
    FOR EACH ROW EXECUTE FUNCTION triloop_verdict_append_only();
CREATE TRIGGER verdict_no_truncate
    BEFORE TRUNCATE ON verdict
    FOR EACH STATEMENT EXECUTE FUNCTION triloop_verdict_append_only();
"""


def _current_db() -> str:
    name = op.get_bind().exec_driver_sql("SELECT current_database()").scalar_one()
    return f'"{name}"'


def _verifier_role() -> None:
    op.execute(f"DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = "
               f"'{VERIFIER}') THEN CREATE ROLE {VERIFIER} LOGIN; END IF; END $$;")
    op.execute(f"GRANT CONNECT ON DATABASE {_current_db()} TO {VERIFIER}")
    op.execute(f"GRANT USAGE ON SCHEMA public TO {VERIFIER}")
    op.execute(f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {VERIFIER}")
    op.execute(f"GRANT SELECT ON {', '.join(VERIFIER_READS)} TO {VERIFIER}")
    op.execute(f"GRANT INSERT ON verdict TO {VERIFIER}")
    # Row-level security (0011) shows a role no trajectory without a policy of its own; the
    # verifier reads every episode it judges, and writes none.
    op.execute(f"CREATE POLICY trajectory_verifier_reads ON trajectory FOR SELECT TO {VERIFIER} "
               "USING (true)")
    op.execute("GRANT SELECT ON verdict TO triloop_governance, triloop_web")
    # A service like the others for the audit log: it names only itself (``verifier``).
    op.execute(_audit_rules((*SERVICE_ROLES, VERIFIER)))
    op.execute(f"GRANT EXECUTE ON FUNCTION {AUDIT_LOG} TO {VERIFIER}")


def upgrade() -> None:
    op.execute(PLAN)
    op.execute(REQUESTERS)
    op.execute("GRANT INSERT ON rollout_batch TO triloop_governance")
    op.execute(VERDICT)
    _verifier_role()


def downgrade() -> None:
    op.execute("DROP POLICY IF EXISTS trajectory_verifier_reads ON trajectory")
    op.execute("DROP TABLE IF EXISTS verdict")
    op.execute("DROP FUNCTION IF EXISTS triloop_verdict_stamped()")
    op.execute("DROP FUNCTION IF EXISTS triloop_verdict_append_only()")
    op.execute(f"REVOKE EXECUTE ON FUNCTION {AUDIT_LOG} FROM {VERIFIER}")
    op.execute(_audit_rules(SERVICE_ROLES))
    # The role stays (roles are cluster-wide, as 0002's are): it keeps no grant here.
    op.execute(f"REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {VERIFIER}")
    op.execute(f"REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM {VERIFIER}")
    op.execute(f"REVOKE ALL ON SCHEMA public FROM {VERIFIER}")
    op.execute(f"REVOKE ALL ON DATABASE {_current_db()} FROM {VERIFIER}")
    op.execute("REVOKE INSERT ON rollout_batch FROM triloop_governance")
    op.execute("DROP TRIGGER IF EXISTS trajectory_planned ON trajectory")
    op.execute("DROP FUNCTION IF EXISTS triloop_trajectory_planned()")
    op.execute("DROP TRIGGER IF EXISTS rollout_batch_requester ON rollout_batch")
    op.execute("DROP FUNCTION IF EXISTS triloop_rollout_batch_requester()")
    op.execute("CREATE TRIGGER rollout_batch_vouched BEFORE INSERT ON rollout_batch "
               "FOR EACH ROW EXECUTE FUNCTION triloop_rollout_batch_vouched()")
    op.execute("ALTER TABLE rollout_batch DROP COLUMN IF EXISTS planned_episodes")
