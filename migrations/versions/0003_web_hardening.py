"""Web hardening (issue 19): revocable, expiring API tokens; frozen eval sets fully closed.

API tokens move from ``app_user.token_hash`` to their own table ``api_token``
(several per person, each with an expiry and a revocation). Only ``triloop_web``
may read it, and it may update only the revocation columns, so no role can
extend a token or swap a hash. Tokens that existed before expire 90 days after
this migration.

The frozen-eval-set triggers of 0002 checked only the new set of an updated item
and ignored TRUNCATE: the owner could move an item out of a frozen set or empty
it. Now an update checks the old and the new set, and TRUNCATE of ``eval_item``
or ``eval_set`` is refused while any set is frozen, for every role.

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

EVAL_ITEM_FROZEN = """
CREATE OR REPLACE FUNCTION triloop_eval_item_frozen() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    touched text[];
    frozen_id text;
BEGIN
    -- An update touches two sets: the one the item leaves and the one it joins.
    IF TG_OP = 'INSERT' THEN
        touched := ARRAY[NEW.eval_set_id];
    ELSIF TG_OP = 'DELETE' THEN
        touched := ARRAY[OLD.eval_set_id];
    ELSE
        touched := ARRAY[OLD.eval_set_id, NEW.eval_set_id];
    END IF;
    SELECT id INTO frozen_id FROM eval_set
        WHERE id = ANY(touched) AND frozen_at IS NOT NULL LIMIT 1;
    IF frozen_id IS NOT NULL THEN
        RAISE EXCEPTION 'eval set % is frozen; create a new version instead', frozen_id
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN COALESCE(NEW, OLD);
END;
$$;

CREATE OR REPLACE FUNCTION triloop_eval_no_truncate() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM eval_set WHERE frozen_at IS NOT NULL) THEN
        RAISE EXCEPTION 'TRUNCATE % refused: frozen eval sets never change', TG_TABLE_NAME
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NULL;
END;
$$;
CREATE TRIGGER eval_item_no_truncate
    BEFORE TRUNCATE ON eval_item
    FOR EACH STATEMENT EXECUTE FUNCTION triloop_eval_no_truncate();
CREATE TRIGGER eval_set_no_truncate
    BEFORE TRUNCATE ON eval_set
    FOR EACH STATEMENT EXECUTE FUNCTION triloop_eval_no_truncate();
"""

# 0002's function, restored on downgrade.
EVAL_ITEM_FROZEN_0002 = """
CREATE OR REPLACE FUNCTION triloop_eval_item_frozen() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    target text := COALESCE(NEW.eval_set_id, OLD.eval_set_id);
BEGIN
    IF EXISTS (SELECT 1 FROM eval_set WHERE id = target AND frozen_at IS NOT NULL) THEN
        RAISE EXCEPTION 'eval set % is frozen; create a new version instead', target
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN COALESCE(NEW, OLD);
END;
$$;
"""


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
    op.execute(EVAL_ITEM_FROZEN)


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS eval_set_no_truncate ON eval_set")
    op.execute("DROP TRIGGER IF EXISTS eval_item_no_truncate ON eval_item")
    op.execute("DROP FUNCTION IF EXISTS triloop_eval_no_truncate()")
    op.execute(EVAL_ITEM_FROZEN_0002)
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
