"""Task sets: versioned, content-addressed collections of tasks, split and tagged.

Issue 26, item 1. A task set holds the tasks of one environment version, from one source
(a dataset file, a generator with parameters, a list of seeds, or a single task). It is
admitted as one unit and declares which of its tasks are for training, for evaluation
and for production traffic.

- ``task`` gains ``item`` (the dataset row or generated problem the task plays; NULL when
  the seed alone makes the task), ``content_digest`` (sha256 of what the agent sees and the
  verifier checks: the rendered initial state and fixture bytes, computed by the execution
  loop, which owns environments) and ``tags`` (domain, capability, difficulty, ...).
  Uniqueness moves from (version, seed) to (version, seed, item): a dataset's rows share
  a version and are told apart by their item.
- ``task_set`` (id: sha256 of its manifest) and ``task_set_member`` (task, split, ordinal,
  digest). A digest appears once per set (so in one split only): a dataset with an item
  repeated across splits is refused by the database itself. The member's digest must be
  its task's (a composite foreign key), so no one records a digest the task does not have.
- Learning sees neither table: which tasks are held out is not its to know. Governance
  writes both; execution, the web service and the verifier read them.

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-02
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0026"
down_revision: str | None = "0025"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

READERS = "triloop_execution, triloop_governance, triloop_web, triloop_verifier"
DIGEST = "'^[0-9a-f]{64}$'"


def upgrade() -> None:
    op.execute(f"""
        ALTER TABLE task
            ADD COLUMN item jsonb,
            ADD COLUMN content_digest text CHECK (content_digest ~ {DIGEST}),
            ADD COLUMN tags jsonb NOT NULL DEFAULT '{{}}'
                CHECK (jsonb_typeof(tags) = 'object');
        ALTER TABLE task DROP CONSTRAINT task_environment_version_id_seed_key;
        CREATE UNIQUE INDEX task_version_seed_item
            ON task (environment_version_id, seed, md5(coalesce(item::text, '')));
        CREATE INDEX task_content_digest ON task (content_digest);
        ALTER TABLE task ADD CONSTRAINT task_id_digest UNIQUE (id, content_digest);
        GRANT UPDATE (content_digest, tags) ON task TO triloop_governance;

        CREATE TABLE task_set (
            id text PRIMARY KEY CHECK (id ~ {DIGEST}),
            name text NOT NULL CHECK (name ~ '^[a-z0-9][a-z0-9_.-]*$'),
            version integer NOT NULL CHECK (version >= 1),
            environment_version_id text NOT NULL REFERENCES environment_version (id),
            source_kind text NOT NULL
                CHECK (source_kind IN ('dataset', 'generator', 'seeds', 'single')),
            source jsonb NOT NULL CHECK (jsonb_typeof(source) = 'object'),
            split_rule jsonb NOT NULL CHECK (jsonb_typeof(split_rule) = 'object'),
            tags jsonb NOT NULL DEFAULT '{{}}' CHECK (jsonb_typeof(tags) = 'object'),
            status text NOT NULL DEFAULT 'pending'
                CHECK (status IN ('pending', 'admitted', 'rejected')),
            evidence jsonb NOT NULL DEFAULT '{{}}',
            decided_by text,
            decided_at timestamptz,
            created_by text NOT NULL,
            created_at timestamptz NOT NULL DEFAULT now(),
            UNIQUE (name, version)
        );
        CREATE INDEX task_set_environment_version ON task_set (environment_version_id);

        CREATE TABLE task_set_member (
            task_set_id text NOT NULL REFERENCES task_set (id),
            task_id text NOT NULL,
            ordinal integer NOT NULL CHECK (ordinal >= 0),
            split text NOT NULL CHECK (split IN ('train', 'eval', 'traffic')),
            content_digest text NOT NULL CHECK (content_digest ~ {DIGEST}),
            PRIMARY KEY (task_set_id, task_id),
            UNIQUE (task_set_id, ordinal),
            CONSTRAINT task_set_member_digest_once UNIQUE (task_set_id, content_digest),
            FOREIGN KEY (task_id, content_digest) REFERENCES task (id, content_digest)
        );
        CREATE INDEX task_set_member_task ON task_set_member (task_id);
        CREATE INDEX task_set_member_digest ON task_set_member (content_digest);

        GRANT SELECT ON task_set, task_set_member TO {READERS};
        GRANT INSERT ON task_set, task_set_member TO triloop_governance;
        GRANT UPDATE (status, evidence, decided_by, decided_at) ON task_set
            TO triloop_governance;
    """)


def downgrade() -> None:
    op.execute("""
        DROP TABLE task_set_member;
        DROP TABLE task_set;
        ALTER TABLE task DROP CONSTRAINT task_id_digest;
        DROP INDEX task_content_digest;
        DROP INDEX task_version_seed_item;
        ALTER TABLE task ADD CONSTRAINT task_environment_version_id_seed_key
            UNIQUE (environment_version_id, seed);
        REVOKE UPDATE (content_digest, tags) ON task FROM triloop_governance;
        ALTER TABLE task DROP COLUMN tags, DROP COLUMN content_digest, DROP COLUMN item;
    """)
