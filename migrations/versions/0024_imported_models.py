"""Imported base models: a checkpoint may carry a unique name and what it was imported from.

Issue 25, item 1: ``triloop model import`` registers a pretrained model (a Hugging Face
directory or a GGUF file) as a root checkpoint. The row records the person-facing
``name`` (unique; RUN.yaml's ``model.base`` may name it), the ``source_kind``
(``huggingface`` | ``gguf``; NULL for checkpoints triloop trained), the
``parameter_count``, the dtype of the weights at the source (``source_dtype``, e.g.
``bfloat16`` or the GGUF's ``q4_1``) and the dtype stored (``dtype``). The learning role
already inserts checkpoints (table-level INSERT), so no grant changes.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-02
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("""
        ALTER TABLE checkpoint
            ADD COLUMN name text CHECK (name <> ''),
            ADD COLUMN source_kind text CHECK (source_kind IN ('huggingface', 'gguf')),
            ADD COLUMN parameter_count bigint CHECK (parameter_count > 0),
            ADD COLUMN source_dtype text,
            ADD COLUMN dtype text
    """)
    op.execute("CREATE UNIQUE INDEX ix_checkpoint_name ON checkpoint (name)")


def downgrade() -> None:
    op.execute("DROP INDEX ix_checkpoint_name")
    op.execute("""
        ALTER TABLE checkpoint
            DROP COLUMN dtype, DROP COLUMN source_dtype, DROP COLUMN parameter_count,
            DROP COLUMN source_kind, DROP COLUMN name
    """)
