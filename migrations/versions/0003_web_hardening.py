"""Web hardening (issue 19): expiring, revocable API tokens out of every loop's reach.

API tokens move from ``app_user.token_hash`` to their own table ``api_token``
(several per person, each with an expiry and a revocation). Only ``triloop_web``
may read it, and it may update only the revocation columns, so no role can
extend a token or swap a hash. Tokens that existed before expire 90 days after
this migration.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

LOOP_ROLES = ("triloop_execution", "triloop_learning", "triloop_governance")
MIGRATED_TOKEN_LIFETIME = "90 days"


def upgrade() -> None:
    op.create_table(
        "api_token",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("user_name", sa.Text(), nullable=False),
        sa.Column("token_hash", sa.Text(), nullable=False),
        sa.Column("label", sa.Text(), nullable=False, server_default=""),
        sa.Column("created_by", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False,
                  server_default=sa.text("now()")),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_by", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["user_name"], ["app_user.name"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("token_hash"),
        sa.CheckConstraint("(revoked_at IS NULL) = (revoked_by IS NULL)",
                           name="api_token_revocation_names_who"),
    )
    op.create_index("ix_api_token_user_name", "api_token", ["user_name"])
    op.execute(
        "INSERT INTO api_token (id, user_name, token_hash, label, created_by, created_at, "
        "expires_at) SELECT replace(gen_random_uuid()::text, '-', ''), name, token_hash, "
        f"'issued before tokens expired', created_by, created_at, "
        f"now() + interval '{MIGRATED_TOKEN_LIFETIME}' FROM app_user"
    )
    op.drop_constraint("app_user_token_hash_key", "app_user", type_="unique")
    op.drop_column("app_user", "token_hash")
    # Only the web service authenticates people: no loop role may read a token hash.
    op.execute("GRANT SELECT, INSERT ON api_token TO triloop_web")
    op.execute("GRANT UPDATE (revoked_at, revoked_by) ON api_token TO triloop_web")
    for role in LOOP_ROLES:
        op.execute(f"REVOKE ALL ON api_token FROM {role}")


def downgrade() -> None:
    op.add_column("app_user", sa.Column("token_hash", sa.Text(), nullable=True))
    # Each person keeps their newest usable token; anyone without one gets an unusable hash.
    op.execute(
        "UPDATE app_user u SET token_hash = t.token_hash FROM ("
        "  SELECT DISTINCT ON (user_name) user_name, token_hash FROM api_token"
        "  WHERE revoked_at IS NULL ORDER BY user_name, created_at DESC) t "
        "WHERE t.user_name = u.name"
    )
    op.execute(
        "UPDATE app_user SET token_hash = md5(random()::text) || md5(random()::text) "
        "WHERE token_hash IS NULL"
    )
    op.alter_column("app_user", "token_hash", nullable=False)
    op.create_unique_constraint("app_user_token_hash_key", "app_user", ["token_hash"])
    op.drop_index("ix_api_token_user_name", table_name="api_token")
    op.drop_table("api_token")
