"""Two-person role grants: a privileged role enters ``app_user.roles`` only once a second
admin confirms the pending grant another admin requested.

``role_grant`` keeps every request: who asked for which role for whom and when, and who
confirmed or refused it and when. The database refuses a grant decided by the admin who
requested it (CHECK), a decided grant that changes again, and any DELETE or TRUNCATE
(trigger), whatever the web service's code does. The web role may insert requests and
update only the decision columns; governance reads ``confirmed_at`` as the time a role
became active.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE = """
CREATE TABLE role_grant (
    id text PRIMARY KEY,
    user_name text NOT NULL REFERENCES app_user (name),
    role text NOT NULL CHECK (role IN ('operator', 'auditor', 'admin')),
    requested_by text NOT NULL CHECK (requested_by <> ''),
    requested_at timestamptz NOT NULL DEFAULT now(),
    confirmed_by text,
    confirmed_at timestamptz,
    status text NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'active', 'refused')),
    CONSTRAINT role_grant_two_people CHECK (confirmed_by IS NULL OR confirmed_by <> requested_by),
    CONSTRAINT role_grant_decided CHECK (
        (status = 'pending') = (confirmed_by IS NULL AND confirmed_at IS NULL))
);
CREATE INDEX ix_role_grant_user_role ON role_grant (user_name, role);
CREATE INDEX ix_role_grant_status ON role_grant (status, requested_at);
CREATE UNIQUE INDEX ux_role_grant_one_pending ON role_grant (user_name, role)
    WHERE status = 'pending';
"""

GUARDS = """
CREATE OR REPLACE FUNCTION triloop_role_grant_final() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.status = 'pending'
       AND NEW.id = OLD.id AND NEW.user_name = OLD.user_name AND NEW.role = OLD.role
       AND NEW.requested_by = OLD.requested_by AND NEW.requested_at = OLD.requested_at THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'role_grant: only a pending grant may be decided, once (% refused)', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$;
CREATE TRIGGER role_grant_final
    BEFORE UPDATE OR DELETE ON role_grant
    FOR EACH ROW EXECUTE FUNCTION triloop_role_grant_final();
CREATE TRIGGER role_grant_no_truncate
    BEFORE TRUNCATE ON role_grant
    FOR EACH STATEMENT EXECUTE FUNCTION triloop_role_grant_final();
"""


def upgrade() -> None:
    op.execute(TABLE)
    op.execute(GUARDS)
    op.execute("GRANT SELECT, INSERT ON role_grant TO triloop_web")
    op.execute("GRANT UPDATE (status, confirmed_by, confirmed_at) ON role_grant TO triloop_web")
    op.execute("GRANT SELECT ON role_grant TO triloop_governance")


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS role_grant")
    op.execute("DROP FUNCTION IF EXISTS triloop_role_grant_final()")
