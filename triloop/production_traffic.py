"""The production traffic the shadow and canary gates may count, as SQL both sides share.

Governance's gates (``governance_loop.gate_windows``) judge these episodes; the web
service counts the same ones to say how far an open gate is from its ``min_samples``. The
fragments live here, in the kernel, so the console's count and the gate's can never mean
different episodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import text
from sqlmodel import Session

from triloop.statuses import Purpose

# The purposes of the candidate's episodes that form the canary gate's canary arm.
CANARY_PURPOSES = (Purpose.CANARY, Purpose.PRODUCTION)
# The database role whose verdicts (``verdict.recorded_by``) the gates count: the verifier,
# which replays each episode; never the execution loop's own ``success``/``total_reward``.
VERIFIER_ROLE = "triloop_verifier"


def judged(alias: str, as_name: str) -> str:
    """SQL: ``CROSS JOIN LATERAL`` the verifier's verdict on episode ``alias`` as
    ``as_name`` (columns ``success``, ``total_reward``); an episode without one drops out,
    so every count below is of episodes the verifier has judged."""
    return (f"CROSS JOIN LATERAL (SELECT v.success, v.total_reward FROM verdict v "
            f"WHERE v.trajectory_id = {alias}.id AND v.recorded_by = '{VERIFIER_ROLE}') "
            f"AS {as_name}")


def requested_traffic(alias: str) -> str:
    """SQL: the episode belongs to production traffic somebody vouched for, a batch the web
    service (or governance) recorded for itself (``rollout_batch``), and is one of the
    episodes that batch planned (a shadow stands for the production episode it mirrors);
    a row slipped in under any other batch id, or outside the plan, is not evidence."""
    return (f"EXISTS (SELECT 1 FROM rollout_batch b WHERE b.id = {alias}.batch_id "
            "AND b.purpose = 'production' AND b.requested_by IN ('web', 'governance') "
            f"AND b.planned_episodes ? regexp_replace({alias}.id, '[:]shadow$', ''))")


# FROM/WHERE of the shadow gate's pairs: a shadow episode ``s`` of the candidate (``:c``)
# since ``:s`` joined to the production episode ``p`` of ``:p`` it mirrors, which names it
# in ``outcome.shadow_of`` (or by id, ``<production id>:shadow``); both sides requested, and
# judged by the verifier (their verdicts ``js`` and ``jp``).
SHADOW_PAIRS_FROM = f"""
            FROM trajectory s
            JOIN trajectory p
              ON p.id = COALESCE(s.outcome->>'shadow_of', regexp_replace(s.id, '[:]shadow$', ''))
            {judged('s', 'js')} {judged('p', 'jp')}
            WHERE s.purpose = 'shadow' AND s.checkpoint_id = :c AND p.checkpoint_id = :p
              AND s.created_at >= :s AND {requested_traffic('s')} AND {requested_traffic('p')}
"""


def count_shadow_pairs(
    *, session: Session, candidate_id: str, production_id: str, since: datetime
) -> int:
    """Paired (production, candidate shadow) episodes since ``since``: the shadow gate's n."""
    value = session.execute(
        text(f"SELECT count(*) {SHADOW_PAIRS_FROM}"),
        {"c": candidate_id, "p": production_id, "s": since},
    ).scalar_one()
    return int(value)


def count_requested_episodes(
    *, session: Session, checkpoint_id: str, purposes: Sequence[str], since: datetime
) -> int:
    """Requested production-traffic episodes a checkpoint served for these purposes since
    ``since``, judged by the verifier: one arm of the canary gate (faulted episodes
    included, as in its first look)."""
    value = session.execute(
        text(f"SELECT count(*) FROM trajectory {judged('trajectory', 'j')} "
             "WHERE checkpoint_id = :c AND purpose = ANY(:p) "
             f"AND created_at >= :s AND {requested_traffic('trajectory')}"),
        {"c": checkpoint_id, "p": list(purposes), "s": since},
    ).scalar_one()
    return int(value)
