"""A checkpoint the learning role inserts is named by a digest and points at an artifact.

The learning worker names each checkpoint by the sha256 of its weights
(``saved_weights_digest``); every process that loads the weights to serve or evaluate
them recomputes that digest and refuses a mismatch (``triloop/weights.py``). What the
database can check by itself it checks here: the id is a sha256 (64 lowercase hex
digits, not a name of the writer's choosing) and the artifact is a ``file://`` or
``s3://`` URI. The owner (set-up, tests) is not limited.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-30
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UP = r"""
CREATE OR REPLACE FUNCTION triloop_checkpoint_is_a_digest() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF current_user <> 'triloop_learning' THEN
        RETURN NEW;
    END IF;
    IF NEW.id !~ '^[0-9a-f]{64}$' THEN
        RAISE EXCEPTION 'checkpoint id % is not the sha256 of its weights (64 hex digits)',
            NEW.id USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF NEW.artifact_uri !~ '^(file|s3)://.+' THEN
        RAISE EXCEPTION 'checkpoint %: artifact_uri % is not a file:// or s3:// URI',
            NEW.id, NEW.artifact_uri USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER checkpoint_is_a_digest
    BEFORE INSERT ON checkpoint
    FOR EACH ROW EXECUTE FUNCTION triloop_checkpoint_is_a_digest();
"""

DOWN = """
DROP TRIGGER IF EXISTS checkpoint_is_a_digest ON checkpoint;
DROP FUNCTION IF EXISTS triloop_checkpoint_is_a_digest();
"""


def upgrade() -> None:
    op.execute(UP)


def downgrade() -> None:
    op.execute(DOWN)
