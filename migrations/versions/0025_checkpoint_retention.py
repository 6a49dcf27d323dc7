"""Checkpoint retention: old iterations' weights are deleted, their lineage rows kept, marked.

``checkpoint.pruned_at`` / ``pruned_rule`` say when a checkpoint's weights and trainer state
were given up and by which rule (``keep_last=3 of run R``). The row, its id (the sha256
of the weights) and its serving hashes stay: the lineage graph is whole, only the bytes
are gone.

Which checkpoints may lose their weights is the database's answer, not the learner's:
what protects a checkpoint lives in tables learning may not read since 0022 (deployments,
their history, routing, promotions). ``triloop_prune_checkpoints(run, keep_last, retain,
dry_run)`` (SECURITY DEFINER, EXECUTE for ``triloop_learning`` only) marks and returns the
run's prunable checkpoints. It protects, whoever asks:

- what serves or may serve production: every alias and its rollback target, every
  checkpoint in any alias's history (a rollback may name any revision), every routing
  slot (production, canary, shadow), both checkpoints of an open promotion;
- every proposed candidate (a ``proposal`` row);
- every base: a root, a run's ``base_checkpoint_id``, any checkpoint another run trained
  from or another checkpoint names as ``base_model``;
- the run's last ``keep_last`` iterations (their training steps' checkpoints, and its
  ``keep_last`` newest checkpoints), never fewer than its own RUN.yaml's
  ``checkpoints.keep_last``: a caller cannot prune a run harder than the run asked for;
- the ids the caller names in ``retain`` (what its workflow still serves: the update's
  parent, in-flight rollouts' checkpoints).

The caller learns only which of that run's checkpoints lost their weights, never why the
others did not. Ordering: mark first (this function, one transaction), delete the files
after. A crash in between leaves a marked row whose files still exist, which is harmless
(the function returns every marked row of the run again, so the next call finishes the
deletion); the other order could leave a row claiming weights that are gone.

Row locks make marking and deploying exclusive: the function first locks the run's
unpruned rows ``FOR UPDATE`` (a deployment, routing, promotion, proposal or batch row
being written holds the foreign key's share lock on its checkpoint until it commits), then
decides under a fresh snapshot; and a trigger refuses a new reference to a pruned
checkpoint, naming the rule that pruned it. A pruned mark is never cleared.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-02
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0025"
down_revision: str | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SERVICE_ROLES = "'triloop_execution', 'triloop_learning', 'triloop_governance', 'triloop_web'"
# table -> the columns that name a checkpoint whose weights must exist.
REFERENCES = {
    "deployment": ("checkpoint_id", "rollback_target_id"),
    "routing": ("checkpoint_id",),
    "promotion": ("checkpoint_id", "baseline_checkpoint_id"),
    "proposal": ("checkpoint_id",),
    "rollout_batch": ("checkpoint_id",),
}

UP = f"""
ALTER TABLE checkpoint ADD COLUMN pruned_at timestamptz;
ALTER TABLE checkpoint ADD COLUMN pruned_rule text;
ALTER TABLE checkpoint ADD CONSTRAINT checkpoint_pruned_with_rule
    CHECK ((pruned_at IS NULL) = (pruned_rule IS NULL));

-- Born unpruned, and a mark is never cleared (the weights are gone).
CREATE OR REPLACE FUNCTION triloop_checkpoint_pruned_mark() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.pruned_at IS NOT NULL AND current_user IN ({SERVICE_ROLES}) THEN
            RAISE EXCEPTION 'checkpoint %: a new checkpoint cannot be marked pruned', NEW.id
                USING ERRCODE = 'insufficient_privilege';
        END IF;
    ELSIF OLD.pruned_at IS NOT NULL AND (NEW.pruned_at IS DISTINCT FROM OLD.pruned_at
            OR NEW.pruned_rule IS DISTINCT FROM OLD.pruned_rule) THEN
        RAISE EXCEPTION 'checkpoint % was pruned on % by %; a pruned mark is never cleared',
            OLD.id, OLD.pruned_at, OLD.pruned_rule USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER checkpoint_pruned_mark
    BEFORE INSERT OR UPDATE ON checkpoint
    FOR EACH ROW EXECUTE FUNCTION triloop_checkpoint_pruned_mark();

-- A row that would serve, judge or train from a checkpoint whose weights were pruned.
-- SECURITY DEFINER: a share lock needs a privilege on checkpoint the writers do not hold.
CREATE OR REPLACE FUNCTION triloop_refuse_pruned_checkpoint() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    column_name text;
    named text;
    found record;
BEGIN
    FOREACH column_name IN ARRAY TG_ARGV LOOP
        named := to_jsonb(NEW) ->> column_name;
        CONTINUE WHEN named IS NULL;
        -- The share lock waits for a pruning transaction on that row, then reads its mark.
        SELECT c.pruned_at, c.pruned_rule INTO found FROM checkpoint c
        WHERE c.id = named FOR KEY SHARE;
        IF found.pruned_at IS NOT NULL THEN
            RAISE EXCEPTION '%.%: checkpoint % was pruned on % by %; its weights are gone.'
                ' Name a kept checkpoint (current production, a candidate, or a recent one)',
                TG_TABLE_NAME, column_name, named, found.pruned_at, found.pruned_rule
                USING ERRCODE = 'insufficient_privilege';
        END IF;
    END LOOP;
    RETURN NEW;
END;
$$;

CREATE OR REPLACE FUNCTION triloop_prune_checkpoints(
    p_run_id text, p_keep_last integer, p_retain text[] DEFAULT '{{}}',
    p_dry_run boolean DEFAULT false
) RETURNS TABLE (checkpoint_id text, artifact_uri text, iteration integer,
                 pruned_at timestamptz, pruned_rule text, newly boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    configured integer;
    keep integer;
    rule text;
    retained text[] := array_remove(COALESCE(p_retain, '{{}}'), NULL);
    prunable text[];
BEGIN
    IF p_keep_last IS NULL OR p_keep_last < 1 THEN
        RAISE EXCEPTION 'keep_last must be at least 1, got %', p_keep_last
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT (r.config -> 'checkpoints' ->> 'keep_last')::integer INTO configured
    FROM training_run r WHERE r.id = p_run_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no training run %', p_run_id USING ERRCODE = 'no_data_found';
    END IF;
    keep := GREATEST(p_keep_last, COALESCE(configured, 1));
    rule := format('keep_last=%s of run %s', keep, p_run_id);
    IF NOT p_dry_run THEN
        PERFORM 1 FROM checkpoint c WHERE c.run_id = p_run_id AND c.pruned_at IS NULL
        ORDER BY c.id FOR UPDATE;
    END IF;
    prunable := ARRAY(
    SELECT c.id FROM checkpoint c
    WHERE c.run_id = p_run_id AND c.pruned_at IS NULL AND c.parent_id IS NOT NULL
      AND NOT c.id = ANY(retained)
      AND c.id NOT IN (SELECT s.checkpoint_id FROM training_step s
                       WHERE s.run_id = p_run_id AND s.checkpoint_id IS NOT NULL
                       ORDER BY s.iteration DESC LIMIT keep)
      AND c.id NOT IN (SELECT n.id FROM checkpoint n WHERE n.run_id = p_run_id
                       ORDER BY n.iteration DESC NULLS LAST, n.created_at DESC LIMIT keep)
      AND NOT EXISTS (SELECT 1 FROM deployment d
                      WHERE c.id IN (d.checkpoint_id, d.rollback_target_id))
      AND NOT EXISTS (SELECT 1 FROM deployment_history h
                      WHERE c.id IN (h.checkpoint_id, h.previous_checkpoint_id))
      AND NOT EXISTS (SELECT 1 FROM routing r WHERE r.checkpoint_id = c.id)
      AND NOT EXISTS (SELECT 1 FROM proposal p WHERE p.checkpoint_id = c.id)
      AND NOT EXISTS (SELECT 1 FROM promotion p WHERE p.status = 'open'
                      AND c.id IN (p.checkpoint_id, p.baseline_checkpoint_id))
      AND NOT EXISTS (SELECT 1 FROM training_run t WHERE t.base_checkpoint_id = c.id)
      AND NOT EXISTS (SELECT 1 FROM checkpoint o WHERE o.parent_id = c.id
                      AND o.run_id IS DISTINCT FROM p_run_id)
      AND NOT EXISTS (SELECT 1 FROM checkpoint o WHERE o.base_model = c.id AND o.id <> c.id)
      AND NOT EXISTS (SELECT 1 FROM training_step s WHERE s.checkpoint_id = c.id
                      AND s.run_id <> p_run_id));
    IF p_dry_run THEN
        RETURN QUERY SELECT c.id::text, c.artifact_uri::text, c.iteration, c.pruned_at,
            COALESCE(c.pruned_rule::text, rule), c.pruned_at IS NULL FROM checkpoint c
        WHERE c.run_id = p_run_id
          AND (c.pruned_at IS NOT NULL OR c.id = ANY(prunable))
        ORDER BY c.iteration, c.id;
        RETURN;
    END IF;
    RETURN QUERY WITH marked AS (
        UPDATE checkpoint c SET pruned_at = now(), pruned_rule = rule
        WHERE c.id = ANY(prunable)
        RETURNING c.id, c.artifact_uri, c.iteration, c.pruned_at, c.pruned_rule
    )
    SELECT m.id::text, m.artifact_uri::text, m.iteration, m.pruned_at, m.pruned_rule::text,
           true FROM marked m
    UNION ALL
    SELECT c.id::text, c.artifact_uri::text, c.iteration, c.pruned_at, c.pruned_rule::text,
           false
    FROM checkpoint c WHERE c.run_id = p_run_id AND c.pruned_at IS NOT NULL
    ORDER BY 3, 1;
END;
$$;
REVOKE ALL ON FUNCTION triloop_prune_checkpoints(text, integer, text[], boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION triloop_prune_checkpoints(text, integer, text[], boolean)
    TO triloop_learning;
"""

DOWN = """
DROP FUNCTION IF EXISTS triloop_prune_checkpoints(text, integer, text[], boolean);
DROP TRIGGER IF EXISTS checkpoint_pruned_mark ON checkpoint;
DROP FUNCTION IF EXISTS triloop_checkpoint_pruned_mark();
ALTER TABLE checkpoint DROP CONSTRAINT IF EXISTS checkpoint_pruned_with_rule;
ALTER TABLE checkpoint DROP COLUMN IF EXISTS pruned_rule;
ALTER TABLE checkpoint DROP COLUMN IF EXISTS pruned_at;
"""


def upgrade() -> None:
    op.execute(UP)
    for table, columns in REFERENCES.items():
        arguments = ", ".join(f"'{c}'" for c in columns)
        op.execute(f"CREATE TRIGGER {table}_not_pruned BEFORE INSERT OR UPDATE ON {table}"
                   f" FOR EACH ROW EXECUTE FUNCTION triloop_refuse_pruned_checkpoint({arguments})")


def downgrade() -> None:
    for table in REFERENCES:
        op.execute(f"DROP TRIGGER IF EXISTS {table}_not_pruned ON {table}")
    op.execute("DROP FUNCTION IF EXISTS triloop_refuse_pruned_checkpoint()")
    op.execute(DOWN)
