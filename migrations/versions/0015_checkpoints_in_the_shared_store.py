"""A checkpoint the learning role inserts may live in the shared artifact store.

With ``TRILOOP_ARTIFACT_URL`` set, the learner publishes each checkpoint into the shared,
content-addressed store and records ``artifact://sha256/<manifest digest>``: the digest of
the manifest that lists every file's sha256 (``triloop/artifacts.py``). 0012's trigger
accepted only ``file://`` and ``s3://``; this adds that form, exactly (64 lowercase hex
digits, nothing after), so the learning role still cannot record a URI of its own making.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-01
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

FUNCTION = r"""
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
    IF NEW.artifact_uri !~ '@ALLOWED@' THEN
        RAISE EXCEPTION 'checkpoint %: artifact_uri % is not @DESCRIBED@',
            NEW.id, NEW.artifact_uri USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END;
$$;
"""

UP = FUNCTION.replace("@ALLOWED@", r"^((file|s3)://.+|artifact://sha256/[0-9a-f]{64})$").replace(
    "@DESCRIBED@", "a file:// or s3:// URI, nor artifact://sha256/<digest>")
DOWN = FUNCTION.replace("@ALLOWED@", r"^(file|s3)://.+").replace(
    "@DESCRIBED@", "a file:// or s3:// URI")


def upgrade() -> None:
    op.execute(UP)


def downgrade() -> None:
    op.execute(DOWN)
