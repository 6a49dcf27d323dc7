"""Webhooks: what operators subscribe to, and each event's delivery (issue 28, item 11).

``webhook`` holds a URL, the event kinds it receives, the shared secret its deliveries are
signed with and how far the audit log has been read for it (``scanned_seq``);
``webhook_delivery`` one row per event per webhook (unique on the event's key), with its
body and how its attempts went. Only the web role reads or writes either: it configures
webhooks for operators and runs the dispatcher, and no other role may see a secret. A
webhook is disabled, never deleted (no DELETE is granted), so its deliveries keep naming it.

Revision ID: 0030
Revises: 0029
Create Date: 2026-12-02
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0030"
down_revision: str | None = "0029"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UP = """
CREATE TABLE webhook (
    id text PRIMARY KEY,
    url text NOT NULL CHECK (url ~ '^https?://'),
    events text[] NOT NULL DEFAULT '{}' CHECK (cardinality(events) > 0),
    secret text NOT NULL CHECK (length(secret) >= 24),
    description text NOT NULL DEFAULT '',
    created_by text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    disabled_at timestamptz,
    disabled_by text,
    scanned_seq bigint NOT NULL
);
CREATE TABLE webhook_delivery (
    id text PRIMARY KEY,
    webhook_id text NOT NULL REFERENCES webhook (id),
    event_kind text NOT NULL,
    event_key text NOT NULL,
    audit_seq bigint NOT NULL,
    body jsonb NOT NULL DEFAULT '{}',
    status text NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'delivered', 'failed')),
    attempts integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    last_status_code integer,
    last_error text,
    created_at timestamptz NOT NULL DEFAULT now(),
    delivered_at timestamptz,
    UNIQUE (webhook_id, event_key)
);
CREATE INDEX ix_webhook_delivery_webhook_id ON webhook_delivery (webhook_id);
CREATE INDEX ix_webhook_delivery_due ON webhook_delivery (next_attempt_at)
    WHERE status = 'pending';
REVOKE ALL ON webhook, webhook_delivery FROM PUBLIC;
GRANT SELECT, INSERT, UPDATE ON webhook, webhook_delivery TO triloop_web;
"""


def upgrade() -> None:
    op.execute(UP)


def downgrade() -> None:
    op.execute("DROP TABLE webhook_delivery; DROP TABLE webhook;")
