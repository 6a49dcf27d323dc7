"""Versions that cover code: environment versions record the hashes of the source files
implementing the environment and its verifier, and the verifier hash admission must
observe; checkpoints record the hashes of their tokenizer, model config and chat template.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-07
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "environment_version",
        sa.Column("code_hashes", postgresql.JSONB(astext_type=sa.Text()),
                  server_default="{}", nullable=False),
    )
    op.add_column("environment_version", sa.Column("verifier_hash", sa.Text(), nullable=True))
    for column in ("tokenizer_sha256", "model_config_sha256", "chat_template_sha256"):
        op.add_column("checkpoint", sa.Column(column, sa.Text(), nullable=True))


def downgrade() -> None:
    for column in ("tokenizer_sha256", "model_config_sha256", "chat_template_sha256"):
        op.drop_column("checkpoint", column)
    op.drop_column("environment_version", "verifier_hash")
    op.drop_column("environment_version", "code_hashes")
