"""Held out by content: two tasks with one content digest are one task; task sets registered.

Issue 26, item 2. ``triloop_held_out_conflicts`` (0022) matched a held-out task by its id or
by its environment and seed. Seeds are not what a task *is*: frozen_lake seeds 43 and 190
draw the same map, and fix_ci_failure picks its repository by ``seed % 3``. Now:

- two tasks are also the same when their content digests are equal (both non-NULL: a
  digest not yet computed matches nothing), whatever their seeds, versions or
  environments; the conflict names the digest;
- the environment-and-seed match also needs equal items (``item IS NOT DISTINCT FROM``):
  a dataset's rows share a version and are told apart by their item, not their seed;
- a task in a task set's traffic split is held out like production traffic, so training
  never takes a task that set aside for traffic.

``triloop_refuse_held_out`` (the triggers' message) names the digest too.
``human_decision.kind`` gains ``task_set`` (subject: the set's name; decision: register;
details: the source, the split rule and the tags): an operator registers a task set.

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-02
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0027"
down_revision: str | None = "0026"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

KINDS_BEFORE = ("'audit', 'approval', 'admission', 'rollback', 'run_control', "
                "'alarm_override', 'environment_version', 'eval_set', 'threshold'")
KINDS_AFTER = KINDS_BEFORE + ", 'task_set'"
CALLERS = "triloop_execution, triloop_web, triloop_governance"

UP = f"""
DROP FUNCTION triloop_held_out_conflicts(text[]);
CREATE FUNCTION triloop_held_out_conflicts(p_tasks text[])
RETURNS TABLE (task_id text, held_task text, environment text, seed integer,
               content_digest text, held_by text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public AS $$
    WITH asked AS (
        SELECT t.id, v.environment_name, t.seed, t.item, t.content_digest FROM task t
        JOIN environment_version v ON v.id = t.environment_version_id
        WHERE t.id = ANY(p_tasks)
    ), twins AS (
        -- the same environment, seed and item under any version (the same task id too)
        SELECT a.id AS task_id, o.id AS twin, a.environment_name, a.seed,
               NULL::text AS digest FROM asked a
        JOIN environment_version ov ON ov.environment_name = a.environment_name
        JOIN task o ON o.environment_version_id = ov.id AND o.seed = a.seed
                   AND o.item IS NOT DISTINCT FROM a.item
        UNION ALL
        -- the same content, whatever the seed, version or environment
        SELECT a.id, o.id, a.environment_name, a.seed, a.content_digest FROM asked a
        JOIN task o ON o.content_digest = a.content_digest AND o.id <> a.id
        WHERE a.content_digest IS NOT NULL
    ), same_world AS (
        SELECT DISTINCT ON (task_id, twin) task_id, twin, environment_name, seed, digest
        FROM twins ORDER BY task_id, twin, digest NULLS LAST
    )
    SELECT w.task_id, w.twin, w.environment_name, w.seed, w.digest,
           'frozen eval set ' || s.name || ' v' || s.version
    FROM same_world w JOIN eval_item i ON i.task_id = w.twin
    JOIN eval_set s ON s.id = i.eval_set_id AND s.frozen_at IS NOT NULL
    UNION
    SELECT w.task_id, w.twin, w.environment_name, w.seed, w.digest, 'production traffic'
    FROM same_world w WHERE EXISTS (
        SELECT 1 FROM trajectory p WHERE p.task_id = w.twin
        AND p.purpose IN ('production', 'shadow', 'canary'))
    UNION
    SELECT w.task_id, w.twin, w.environment_name, w.seed, w.digest,
           'the traffic split of task set ' || ts.name || ' v' || ts.version
    FROM same_world w JOIN task_set_member m ON m.task_id = w.twin AND m.split = 'traffic'
    JOIN task_set ts ON ts.id = m.task_set_id
    ORDER BY 1, 2, 6
$$;
REVOKE ALL ON FUNCTION triloop_held_out_conflicts(text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION triloop_held_out_conflicts(text[]) TO {CALLERS};

CREATE OR REPLACE FUNCTION triloop_refuse_held_out(p_what text, p_tasks text[])
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    found text;
BEGIN
    SELECT string_agg(format('task %s is %s (%s seed %s, in %s)', c.task_id,
                             CASE WHEN c.task_id = c.held_task THEN 'held out'
                                  WHEN c.content_digest IS NOT NULL THEN
                                      'the same content (digest ' || c.content_digest
                                      || ') as held-out task ' || c.held_task
                                  ELSE 'the same world as held-out task ' || c.held_task END,
                             c.environment, c.seed, c.held_by), '; ')
    INTO found FROM triloop_held_out_conflicts(p_tasks) c;
    IF found IS NOT NULL THEN
        RAISE EXCEPTION '%: training must stay off eval and production-traffic tasks; %',
            p_what, found USING ERRCODE = 'insufficient_privilege';
    END IF;
END;
$$;

ALTER TABLE human_decision DROP CONSTRAINT IF EXISTS human_decision_kind_check;
ALTER TABLE human_decision ADD CONSTRAINT human_decision_kind_check
    CHECK (kind IN ({KINDS_AFTER}));
"""

DOWN = f"""
ALTER TABLE human_decision DROP CONSTRAINT IF EXISTS human_decision_kind_check;
ALTER TABLE human_decision ADD CONSTRAINT human_decision_kind_check
    CHECK (kind IN ({KINDS_BEFORE}));

DROP FUNCTION triloop_held_out_conflicts(text[]);
CREATE FUNCTION triloop_held_out_conflicts(p_tasks text[])
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
GRANT EXECUTE ON FUNCTION triloop_held_out_conflicts(text[]) TO {CALLERS};

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
"""


def upgrade() -> None:
    op.execute(UP)


def downgrade() -> None:
    # Decision rows are append-only: a database that recorded a task_set decision cannot go
    # back below this revision, because the restored constraint would refuse those rows.
    op.execute(DOWN)
