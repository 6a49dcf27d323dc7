"""Episode reads for the gates: rows the execution loop wrote, never written here."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import text
from sqlmodel import Session


@dataclass(frozen=True)
class Outcomes:
    """Successes and rewards of a set of episodes."""

    successes: list[bool]
    rewards: list[float]


def batch_outcomes(*, session: Session, batch_id: str) -> Outcomes:
    """Outcomes of one rollout batch's own episodes (shadows excluded)."""
    rows = session.execute(
        text(
            "SELECT success, total_reward FROM trajectory "
            "WHERE batch_id = :b AND purpose <> 'shadow' ORDER BY id"
        ),
        {"b": batch_id},
    ).all()
    return Outcomes([bool(r[0]) for r in rows], [float(r[1]) for r in rows])


def episode_counts(
    *, session: Session, checkpoint_id: str, purposes: Sequence[str], since: datetime,
    until: datetime | None = None,
) -> tuple[int, int]:
    """(episodes, successes) a checkpoint served for these purposes in a time window."""
    row = session.execute(
        text(
            "SELECT count(*), count(*) FILTER (WHERE success) FROM trajectory "
            "WHERE checkpoint_id = :c AND purpose = ANY(:p) AND created_at >= :s "
            "AND (CAST(:u AS timestamptz) IS NULL OR created_at < :u)"
        ),
        {"c": checkpoint_id, "p": list(purposes), "s": since, "u": until},
    ).one()
    return int(row[0]), int(row[1])


def reward_summary(
    *, session: Session, checkpoint_id: str, purposes: Sequence[str], since: datetime,
    until: datetime | None = None,
) -> tuple[int, float, float]:
    """(episodes, mean reward, sample variance of reward) in a time window."""
    row = session.execute(
        text(
            "SELECT count(*), coalesce(avg(total_reward), 0), coalesce(var_samp(total_reward), 0) "
            "FROM trajectory WHERE checkpoint_id = :c AND purpose = ANY(:p) "
            "AND created_at >= :s AND (CAST(:u AS timestamptz) IS NULL OR created_at < :u)"
        ),
        {"c": checkpoint_id, "p": list(purposes), "s": since, "u": until},
    ).one()
    return int(row[0]), float(row[1]), float(row[2])


def shadow_pairs(
    *, session: Session, candidate_id: str, production_id: str, since: datetime
) -> list[tuple[str, int, int, float, float]]:
    """(episode, steps compared, steps agreed, production reward, candidate reward) per pair.

    A shadow episode names the production episode it mirrors in ``outcome.shadow_of``
    (or by its id, ``<production id>:shadow``); agreement compares the action text
    of steps with the same index.
    """
    rows = session.execute(
        text(
            """
            SELECT p.id,
                   (SELECT count(*) FROM step a JOIN step b ON a.index = b.index
                     WHERE a.trajectory_id = s.id AND b.trajectory_id = p.id),
                   (SELECT count(*) FROM step a JOIN step b ON a.index = b.index
                     WHERE a.trajectory_id = s.id AND b.trajectory_id = p.id
                       AND a.action_text = b.action_text),
                   p.total_reward, s.total_reward
            FROM trajectory s
            JOIN trajectory p
              ON p.id = COALESCE(s.outcome->>'shadow_of', regexp_replace(s.id, '[:]shadow$', ''))
            WHERE s.purpose = 'shadow' AND s.checkpoint_id = :c AND p.checkpoint_id = :p
              AND s.created_at >= :s
            ORDER BY p.id
            """
        ),
        {"c": candidate_id, "p": production_id, "s": since},
    ).all()
    return [(str(r[0]), int(r[1]), int(r[2]), float(r[3]), float(r[4])) for r in rows]
