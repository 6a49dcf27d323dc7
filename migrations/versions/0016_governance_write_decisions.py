"""People register environment versions, freeze eval sets and set thresholds through the API.

``human_decision.kind`` gains ``environment_version`` (subject: the environment's name;
decision: ``register``; details: the contract text and its fixtures), ``eval_set``
(subject: the eval set's name; decision: ``create``; details: the task ids) and
``threshold`` (subject: the threshold's name; decision: ``set``; details: the spec and the
eval set). Only the web role may insert them; governance carries them out for the person.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-01
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

KINDS_BEFORE = "'audit', 'approval', 'admission', 'rollback', 'run_control', 'alarm_override'"
KINDS_AFTER = KINDS_BEFORE + ", 'environment_version', 'eval_set', 'threshold'"


def _check(kinds: str) -> None:
    op.execute("ALTER TABLE human_decision DROP CONSTRAINT IF EXISTS human_decision_kind_check")
    op.execute(f"ALTER TABLE human_decision ADD CONSTRAINT human_decision_kind_check"
               f" CHECK (kind IN ({kinds}))")


def upgrade() -> None:
    _check(KINDS_AFTER)


def downgrade() -> None:
    # Decision rows are append-only: a database that recorded one of the new kinds cannot
    # go back below this revision, because the constraint would refuse those rows.
    _check(KINDS_BEFORE)
