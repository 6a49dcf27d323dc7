"""One token sequence per trajectory; steps point into it by offsets.

Until now every ``step`` row stored the full prompt fed at that turn, so a trajectory's
opening context was stored once per turn (quadratic in the turns). Now
``trajectory_sequence`` holds each episode's tokens once: the first prompt, then per turn
the tokens its prompt added (template, observation) and the action, with the action mask
(1 on sampled tokens), the behaviour logprobs (one per sampled token) and the segment
starts. A turn whose prompt does not extend the sequence so far (a context rule that
drops old turns, an agent that rewrote its history) opens a new segment holding its whole
prompt (see ``triloop.token_sequence``). Each step keeps its observation, action text,
feedback, reward and done, and gains ``prompt_start``, ``observation_start``,
``action_start``, ``action_end``.

Upgrade packs the existing steps with that rule. A stored per-step action mask is not
carried over: the mask is derived from the offsets (1 on exactly the action), which is
the only mask the learner ever accepted. A step whose logprobs do not match its action
cannot be laid out and stops the upgrade, naming it.

Permissions stay as they were: execution may INSERT the sequence (as it inserts steps)
and every service role but learning may SELECT it; learning reads
``learning_trajectory_sequence``, a security-barrier view of training trajectories only
(like ``learning_step``, 0011). ``learning_step`` is recreated with the columns it had,
less the token arrays and plus the offsets (and back on downgrade), so a column another
revision added to it, or left out of it, stays as that revision made it.

Downgrade restores the per-step arrays from the sequence and drops the new table.

Revision ID: 0018
Revises: 0016
Create Date: 2026-12-01
"""

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TOKEN_COLUMNS = ("prompt_token_ids", "action_token_ids", "action_mask", "behaviour_logprobs")
OFFSET_COLUMNS = ("prompt_start", "observation_start", "action_start", "action_end")
READERS = "triloop_execution, triloop_governance, triloop_web"

LEARNING_STEP_VIEW = """
CREATE VIEW learning_step WITH (security_barrier) AS
    SELECT {columns} FROM step s JOIN trajectory t ON t.id = s.trajectory_id
    WHERE t.purpose = 'training' AND t.run_id IS NOT NULL;
GRANT SELECT ON learning_step TO triloop_learning;
"""

CREATE_SEQUENCE = f"""
CREATE TABLE trajectory_sequence (
    trajectory_id varchar PRIMARY KEY REFERENCES trajectory (id),
    token_ids int4[] NOT NULL DEFAULT '{{}}',
    action_mask int2[] NOT NULL DEFAULT '{{}}',
    behaviour_logprobs float8[] NOT NULL DEFAULT '{{}}',
    segment_starts int4[] NOT NULL DEFAULT '{{}}'
);
GRANT SELECT ON trajectory_sequence TO {READERS};
GRANT INSERT ON trajectory_sequence TO triloop_execution;
CREATE VIEW learning_trajectory_sequence WITH (security_barrier) AS
    SELECT q.* FROM trajectory_sequence q JOIN trajectory t ON t.id = q.trajectory_id
    WHERE t.purpose = 'training' AND t.run_id IS NOT NULL;
GRANT SELECT ON learning_trajectory_sequence TO triloop_learning;
"""

RESTORE_STEP_ARRAYS = """
WITH before AS (  -- action tokens ahead of each step's action: where its logprobs start
    SELECT s.trajectory_id, s."index", (
        SELECT count(*) FROM unnest(q.action_mask[1 : s.action_start]) m WHERE m = 1
    )::int AS n
    FROM step s JOIN trajectory_sequence q ON q.trajectory_id = s.trajectory_id
)
UPDATE step s SET
    prompt_token_ids = q.token_ids[s.prompt_start + 1 : s.action_start],
    action_token_ids = q.token_ids[s.action_start + 1 : s.action_end],
    action_mask = array_fill(0::int2, ARRAY[s.action_start - s.prompt_start])
        || array_fill(1::int2, ARRAY[s.action_end - s.action_start]),
    behaviour_logprobs = q.behaviour_logprobs[b.n + 1 : b.n + s.action_end - s.action_start]
FROM trajectory_sequence q, before b
WHERE q.trajectory_id = s.trajectory_id
    AND b.trajectory_id = s.trajectory_id AND b."index" = s."index"
"""


def _pack(trajectory_id: str, steps: Sequence[Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The rule of ``triloop.token_sequence.pack_turns``, frozen here as of this revision."""
    ids: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    starts: list[int] = []
    offsets: list[dict[str, Any]] = []
    segment_start = 0
    for step in steps:
        prompt, action = list(step.prompt_token_ids), list(step.action_token_ids)
        if len(step.behaviour_logprobs) != len(action):
            raise RuntimeError(
                f"step {step.index} of trajectory {trajectory_id!r} has"
                f" {len(step.behaviour_logprobs)} behaviour logprobs for {len(action)} action"
                " tokens and cannot be laid out as a sequence; fix or delete it, then upgrade")
        current = len(ids) - segment_start
        if not (offsets and prompt[:current] == ids[segment_start:]):
            segment_start, current = len(ids), 0
            starts.append(segment_start)
        observation_start = len(ids)
        ids += prompt[current:]
        mask += [0] * (len(prompt) - current)
        action_start = len(ids)
        ids += action
        mask += [1] * len(action)
        logprobs += [float(x) for x in step.behaviour_logprobs]
        offsets.append({"t": trajectory_id, "i": step.index, "p": segment_start,
                        "o": observation_start, "a": action_start, "e": len(ids)})
    sequence = {"t": trajectory_id, "ids": ids, "mask": mask, "lp": logprobs, "starts": starts}
    return sequence, offsets


def _learning_step_columns(drop: Sequence[str], add: Sequence[str]) -> str:
    """``learning_step``'s columns as they are now (whatever other revisions put there),
    less ``drop`` and plus ``add``. The view pins the step columns it selects, so it is
    dropped while they change and recreated with exactly these."""
    kept = [r[0] for r in op.get_bind().execute(sa.text(
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'learning_step'"
        " ORDER BY ordinal_position")) if r[0] not in drop]
    return ", ".join(f's."{c}"' for c in [*kept, *add])


def upgrade() -> None:
    op.execute(CREATE_SEQUENCE)
    for column in OFFSET_COLUMNS:
        op.execute(f"ALTER TABLE step ADD COLUMN {column} int4 NOT NULL DEFAULT 0")
    conn = op.get_bind()
    trajectory_ids = [r[0] for r in conn.execute(
        sa.text("SELECT DISTINCT trajectory_id FROM step ORDER BY trajectory_id"))]
    for trajectory_id in trajectory_ids:
        steps = list(conn.execute(sa.text(
            'SELECT "index", prompt_token_ids, action_token_ids, behaviour_logprobs FROM step'
            ' WHERE trajectory_id = :t ORDER BY "index"'), {"t": trajectory_id}))
        sequence, offsets = _pack(trajectory_id, steps)
        conn.execute(sa.text(
            "INSERT INTO trajectory_sequence VALUES"
            " (:t, CAST(:ids AS int4[]), CAST(:mask AS int2[]), CAST(:lp AS float8[]),"
            " CAST(:starts AS int4[]))"), sequence)
        conn.execute(sa.text(
            'UPDATE step SET prompt_start = :p, observation_start = :o, action_start = :a,'
            ' action_end = :e WHERE trajectory_id = :t AND "index" = :i'), offsets)
    columns = _learning_step_columns(TOKEN_COLUMNS, OFFSET_COLUMNS)
    op.execute("DROP VIEW learning_step")
    for column in TOKEN_COLUMNS:
        op.execute(f"ALTER TABLE step DROP COLUMN {column}")
    op.execute(LEARNING_STEP_VIEW.format(columns=columns))


def downgrade() -> None:
    columns = _learning_step_columns(OFFSET_COLUMNS, TOKEN_COLUMNS)
    op.execute("DROP VIEW learning_step")
    op.execute("ALTER TABLE step ADD COLUMN prompt_token_ids int4[] NOT NULL DEFAULT '{}',"
               " ADD COLUMN action_token_ids int4[] NOT NULL DEFAULT '{}',"
               " ADD COLUMN action_mask int2[] NOT NULL DEFAULT '{}',"
               " ADD COLUMN behaviour_logprobs float8[] NOT NULL DEFAULT '{}'")
    op.execute(RESTORE_STEP_ARRAYS)
    for column in OFFSET_COLUMNS:
        op.execute(f"ALTER TABLE step DROP COLUMN {column}")
    op.execute(LEARNING_STEP_VIEW.format(columns=columns))
    op.execute("DROP VIEW learning_trajectory_sequence")
    op.execute("DROP TABLE trajectory_sequence")
