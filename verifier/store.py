"""The verifier's reads and its one write, as ``triloop_verifier``.

Claiming: the role has no UPDATE on ``trajectory`` (it never changes an episode), and
PostgreSQL's ``FOR UPDATE SKIP LOCKED`` needs that privilege, so verifiers claim an episode
with a transaction-scoped advisory lock on its id instead; one another verifier holds is
skipped, and the verdict's key keeps a race to one row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlmodel import Session

from triloop.episode_plan import planned_id
from triloop.models import Verdict

# The episodes whose reward a gate counts: the verifier judges these. Training episodes
# keep the execution loop's own verdict (the learner, not a gate, reads them).
JUDGED_PURPOSES = ("eval", "shadow", "canary", "production")

_CLAIM = text("""
    SELECT t.id, t.batch_id, t.task_id, t.success, t.total_reward, b.planned_episodes
    FROM trajectory t JOIN rollout_batch b ON b.id = t.batch_id
    WHERE t.purpose = ANY(:purposes)
      AND NOT EXISTS (SELECT 1 FROM verdict v WHERE v.trajectory_id = t.id)
      AND pg_try_advisory_xact_lock(hashtextextended('verdict:' || t.id, 0))
    ORDER BY t.created_at, t.id
    LIMIT :n
""")


@dataclass(frozen=True)
class Pending:
    """A stored episode to judge, with what its batch planned for it (None: not planned)."""

    trajectory_id: str
    batch_id: str
    task_id: str
    claimed_success: bool
    claimed_reward: float
    planned: dict[str, Any] | None


def claim_pending(*, session: Session, limit: int) -> list[Pending]:
    """Episodes without a verdict, locked for this transaction (oldest first)."""
    rows = session.execute(_CLAIM, {"purposes": list(JUDGED_PURPOSES), "n": limit}).all()
    return [Pending(trajectory_id=r[0], batch_id=r[1], task_id=r[2], claimed_success=bool(r[3]),
                    claimed_reward=float(r[4]), planned=(r[5] or {}).get(planned_id(r[0])))
            for r in rows]


def stored_actions(*, session: Session, trajectory_id: str) -> list[str]:
    """The episode's actions as the model wrote them, in turn order."""
    rows = session.execute(text("SELECT action_text FROM step WHERE trajectory_id = :t "
                                "ORDER BY index"), {"t": trajectory_id}).all()
    return [str(r[0]) for r in rows]


def add_verdict(*, session: Session, verdict: Verdict) -> None:
    """The verdict row (the database stamps the role); one per episode."""
    session.add(verdict)
