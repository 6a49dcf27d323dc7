"""A stored alarm is one object: ``training_step.metrics.alarms`` replaces ``alarm_messages``.

Before, an iteration's alarms were two arrays read back together by index: the kinds in
``training_step.alarms`` and the messages in ``metrics.alarm_messages``. Now
``metrics.alarms`` holds each alarm whole (kind, iteration, message, evidence: what the
audit log records); ``training_step.alarms`` keeps the kinds as an index for SQL. Stored
iterations are rewritten here (evidence was never stored with them: it is ``{}``).

Revision ID: 0019
Revises: 0016
Create Date: 2026-12-01
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("""
        UPDATE training_step SET metrics = (metrics - 'alarm_messages') || jsonb_build_object(
            'alarms', (SELECT coalesce(jsonb_agg(jsonb_build_object(
                'kind', kind, 'iteration', iteration,
                'message', coalesce(metrics -> 'alarm_messages' ->> (position - 1)::int, kind),
                'evidence', '{}'::jsonb) ORDER BY position), '[]'::jsonb)
                FROM unnest(alarms) WITH ORDINALITY AS listed(kind, position)))
        WHERE metrics ? 'alarm_messages' OR NOT metrics ? 'alarms'
    """)


def downgrade() -> None:
    op.execute("""
        UPDATE training_step SET metrics = (metrics - 'alarms') || jsonb_build_object(
            'alarm_messages', (SELECT coalesce(jsonb_agg(alarm ->> 'message'
                                                         ORDER BY position), '[]'::jsonb)
                FROM jsonb_array_elements(coalesce(metrics -> 'alarms', '[]'::jsonb))
                     WITH ORDINALITY AS listed(alarm, position)))
    """)
