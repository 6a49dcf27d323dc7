"""Episode reads for the gates: rows the execution loop and the verifier wrote, never here.

Every gate counts the verifier's verdicts (``verdict``, written by ``triloop_verifier``), not
the execution loop's own ``success``/``total_reward``; a window gate's counts hold only the
episodes the verifier has judged so far, and offline eval waits until it has judged all.

Episodes served while an operator's fault was injected carry ``outcome.injected_fault``.
Every count can leave them out (``clean=True``) and ``fault_summary`` names the faults in
a window, so a gate can let them fail a candidate but never count them toward a pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlmodel import Session

from governance_loop.gates.attribution import verdict_terms
from governance_loop.gates.behaviour_audit import EpisodeBehaviour
from triloop.models import RolloutBatch
from triloop.production_traffic import SHADOW_PAIRS_FROM, VERIFIER_ROLE, judged
from triloop.production_traffic import requested_traffic as _requested_traffic
from triloop.statuses import Purpose

# SQL: the episode was served without an injected fault (or every episode, when not clean).
_CLEAN = "(NOT CAST(:clean AS boolean) OR (outcome->'injected_fault') IS NULL)"


# A gate's window: (checkpoint, purposes, since, until; None is open-ended).
Window = tuple[str, Sequence[str], datetime, datetime | None]
# SQL: a trajectory in one window (:c checkpoint, :p purposes, :s since, :u until or NULL).
_IN_WINDOW = ("checkpoint_id = :c AND purpose = ANY(:p) AND created_at >= :s "
              "AND (CAST(:u AS timestamptz) IS NULL OR created_at < :u)")
# SQL on a shadow step ``a``: the execution loop's verdict for it (a missing verdict is false).
_COMPARED = "(a.feedback #>> '{shadow_agreement,compared}') = 'true'"
_AGREED = "(a.feedback #>> '{shadow_agreement,agreed}') = 'true'"
# SQL: the verifier's split of episode ``alias``'s reward (``details.terms``).
_VERDICT_TERMS = ("(SELECT v.details->'terms' FROM verdict v WHERE v.trajectory_id = "
                  f"{{alias}}.id AND v.recorded_by = '{VERIFIER_ROLE}')")


@dataclass(frozen=True)
class FaultSummary:
    """Episodes of a window that an injected fault touched, and the faults themselves."""

    episodes: int
    faults: list[dict[str, Any]]


@dataclass(frozen=True)
class Outcomes:
    """Successes and rewards of a set of episodes."""

    successes: list[bool]
    rewards: list[float]


@dataclass(frozen=True)
class BoundOutcomes:
    """A requested batch's episodes that count, and why any others do not."""

    outcomes: Outcomes
    problems: list[str]


def requested_batch_outcomes(
    *, session: Session, batch_id: str, checkpoint_id: str, purpose: str = Purpose.EVAL,
    task_ids: Sequence[str] | None = None,
) -> BoundOutcomes:
    """Outcomes of a batch governance asked for, counting only what it asked for.

    The batch's ``rollout_batch`` row must say governance requested it, for this purpose
    and checkpoint; otherwise nothing in it counts. Only the episodes it planned count
    (the database refuses the execution role any other); episodes a different checkpoint
    served never count. Each such finding is a problem the gate reports (and audits).
    Success and reward are the verifier's verdict (``verdict``, written by its own role),
    never the execution loop's row; an episode without one is not counted (offline eval
    waits for them first: ``unjudged_episodes``). ``task_ids``: count only the episodes of
    these tasks (one eval set's share of a batch that plays several).
    """
    counted, problems = _counted_in_batch(session=session, batch_id=batch_id,
                                          checkpoint_id=checkpoint_id, purpose=purpose,
                                          task_ids=task_ids)
    return BoundOutcomes(Outcomes([bool(r[0]) for r in counted],
                                  [float(r[1]) for r in counted]), problems)


def episode_terms(
    *, session: Session, batch_id: str, checkpoint_id: str, purpose: str = Purpose.EVAL,
    task_ids: Sequence[str] | None = None,
) -> list[dict[str, float]]:
    """Each counted episode's reward split by term (the verifier's ``details.terms``), in
    the order and under the filter of ``requested_batch_outcomes``."""
    counted, _ = _counted_in_batch(session=session, batch_id=batch_id,
                                   checkpoint_id=checkpoint_id, purpose=purpose,
                                   task_ids=task_ids)
    return [verdict_terms(r[6], success=bool(r[0]), total_reward=float(r[1])) for r in counted]


def _counted_in_batch(
    *, session: Session, batch_id: str, checkpoint_id: str, purpose: str,
    task_ids: Sequence[str] | None,
) -> tuple[list[Any], list[str]]:
    """The verdict rows (success, total_reward, ..., terms, episode id) of a batch's
    episodes that count, and the problems that left any out (``requested_batch_outcomes``)."""
    batch = session.get(RolloutBatch, batch_id)
    if batch is None:
        return [], [f"batch {batch_id} was never requested"]
    asked = (batch.requested_by, batch.purpose, batch.checkpoint_id)
    if asked != ("governance", purpose, checkpoint_id):
        return [], [
            f"batch {batch_id} was requested by {batch.requested_by} for {batch.purpose} of "
            f"{batch.checkpoint_id}, not by governance for {purpose} of {checkpoint_id}"]
    rows = session.execute(
        text("SELECT v.success, v.total_reward, t.checkpoint_id, "
             "coalesce(b.planned_episodes ? t.id, false), v.trajectory_id IS NOT NULL, "
             "t.task_id, v.details->'terms', t.id "
             "FROM trajectory t JOIN rollout_batch b ON b.id = t.batch_id "
             f"LEFT JOIN verdict v ON v.trajectory_id = t.id AND v.recorded_by = '{VERIFIER_ROLE}' "
             "WHERE t.batch_id = :b AND t.purpose <> 'shadow' ORDER BY t.id"),
        {"b": batch_id},
    ).all()
    planned = [r for r in rows if r[3]]
    served = [r for r in planned if r[2] == checkpoint_id]
    counted = [r for r in served if r[4] and (task_ids is None or r[5] in task_ids)]
    problems = []
    if len(planned) < len(rows):
        problems.append(f"{len(rows) - len(planned)} episodes of batch {batch_id} are not "
                        "among the episodes it planned; not counted")
    if len(served) < len(planned):
        problems.append(f"{len(planned) - len(served)} episodes of batch {batch_id} were served "
                        f"by another checkpoint than {checkpoint_id}; not counted")
    return counted, problems


def process_terms(*, session: Session, task_ids: Sequence[str]) -> frozenset[str]:
    """The process (per-step) reward terms the contracts of these tasks' environment
    versions name: which of an episode's terms are not outcome terms."""
    rows = session.execute(
        text("SELECT DISTINCT jsonb_object_keys(coalesce(ev.contract #> '{reward,process}', "
             "'{}'::jsonb)) FROM task t JOIN environment_version ev "
             "ON ev.id = t.environment_version_id WHERE t.id = ANY(:t)"),
        {"t": list(task_ids)},
    ).all()
    return frozenset(str(r[0]) for r in rows)


def unjudged_episodes(*, session: Session, batch_ids: Sequence[str]) -> list[str]:
    """Stored, planned episodes of these batches that the verifier has not judged yet."""
    rows = session.execute(
        text("SELECT t.id FROM trajectory t JOIN rollout_batch b ON b.id = t.batch_id "
             "WHERE t.batch_id = ANY(:b) AND t.purpose <> 'shadow' AND b.planned_episodes ? t.id "
             "AND NOT EXISTS (SELECT 1 FROM verdict v WHERE v.trajectory_id = t.id "
             f"AND v.recorded_by = '{VERIFIER_ROLE}') ORDER BY t.id"),
        {"b": list(batch_ids)},
    ).all()
    return [str(r[0]) for r in rows]


def unjudged_in_windows(*, session: Session, windows: Sequence[Window]) -> list[str]:
    """Requested episodes in these windows that the verifier has not judged yet."""
    unjudged: list[str] = []
    for checkpoint_id, purposes, since, until in windows:
        rows = session.execute(
            text("SELECT id FROM trajectory "
                 f"WHERE {_IN_WINDOW} AND {_requested_traffic('trajectory')} "
                 "AND NOT EXISTS (SELECT 1 FROM verdict v WHERE v.trajectory_id = trajectory.id "
                 f"AND v.recorded_by = '{VERIFIER_ROLE}') ORDER BY id"),
            {"c": checkpoint_id, "p": list(purposes), "s": since, "u": until},
        ).all()
        unjudged += [str(r[0]) for r in rows]
    return unjudged


def episode_counts(
    *, session: Session, checkpoint_id: str, purposes: Sequence[str], since: datetime,
    until: datetime | None = None, clean: bool = False,
) -> tuple[int, int]:
    """(episodes, successes) a checkpoint served for these purposes in a time window."""
    row = session.execute(
        text(
            "SELECT count(*), count(*) FILTER (WHERE j.success) FROM trajectory "
            f"{judged('trajectory', 'j')} "
            f"WHERE {_IN_WINDOW} AND {_CLEAN} AND {_requested_traffic('trajectory')}"
        ),
        {"c": checkpoint_id, "p": list(purposes), "s": since, "u": until, "clean": clean},
    ).one()
    return int(row[0]), int(row[1])


def reward_summary(
    *, session: Session, checkpoint_id: str, purposes: Sequence[str], since: datetime,
    until: datetime | None = None, clean: bool = False,
) -> tuple[int, float, float]:
    """(episodes, mean reward, sample variance of reward) in a time window."""
    row = session.execute(
        text(
            "SELECT count(*), coalesce(avg(j.total_reward), 0), "
            "coalesce(var_samp(j.total_reward), 0) "
            f"FROM trajectory {judged('trajectory', 'j')} WHERE {_IN_WINDOW} AND {_CLEAN} "
            f"AND {_requested_traffic('trajectory')}"
        ),
        {"c": checkpoint_id, "p": list(purposes), "s": since, "u": until, "clean": clean},
    ).one()
    return int(row[0]), float(row[1]), float(row[2])


def fault_summary(
    *, session: Session, windows: Sequence[Window],
) -> FaultSummary:
    """Faulted episodes in these (checkpoint, purposes, since, until) windows, and their faults."""
    episodes, faults = 0, []
    for checkpoint_id, purposes, since, until in windows:
        rows = session.execute(
            text(
                "SELECT outcome->'injected_fault', count(*) FROM trajectory "
                f"WHERE {_IN_WINDOW} AND (outcome->'injected_fault') IS NOT NULL GROUP BY 1"
            ),
            {"c": checkpoint_id, "p": list(purposes), "s": since, "u": until},
        ).all()
        for fault, count in rows:
            episodes += int(count)
            if fault not in faults:
                faults.append(fault)
    return FaultSummary(episodes, faults)


@dataclass(frozen=True)
class LeftOut:
    """Episodes in a gate's windows that no requested batch vouches for (never counted)."""

    episodes: int
    examples: list[str]


def unrequested_episodes(
    *, session: Session, windows: Sequence[Window],
    examples: int = 5,
) -> LeftOut:
    """Episodes these (checkpoint, purposes, since, until) windows hold outside any batch the
    web service or governance requested: what every window count above leaves out, so the
    gate can say how many and audit them."""
    total, named = 0, []
    for checkpoint_id, purposes, since, until in windows:
        rows = session.execute(
            text(
                "SELECT id, count(*) OVER () FROM trajectory "
                f"WHERE {_IN_WINDOW} AND NOT {_requested_traffic('trajectory')} "
                "ORDER BY id LIMIT :n"
            ),
            {"c": checkpoint_id, "p": list(purposes), "s": since, "u": until, "n": examples},
        ).all()
        if rows:
            total += int(rows[0][1])
            named += [str(r[0]) for r in rows]
    return LeftOut(total, named[:examples])


def shadow_pairs(
    *, session: Session, candidate_id: str, production_id: str, since: datetime
) -> list[tuple[str, int, int, float, float, dict[str, Any] | None]]:
    """(episode, steps compared, steps agreed, production reward, candidate reward, fault)
    per pair; the fault is the one injected on either side of the pair, if any.

    A shadow episode names the production episode it mirrors in ``outcome.shadow_of``
    (or by its id, ``<production id>:shadow``). Agreement is what the execution loop
    recorded on each shadow step (``feedback.shadow_agreement``): a step is compared only
    while both policies had seen the same observation history, so once the shadow's own
    environment copy has diverged its later steps count for nothing, even when their
    action text happens to match production's step of the same index.
    """
    rows = session.execute(
        text(
            f"""
            SELECT p.id,
                   (SELECT count(*) FROM step a
                     WHERE a.trajectory_id = s.id AND {_COMPARED}),
                   (SELECT count(*) FROM step a
                     WHERE a.trajectory_id = s.id AND {_COMPARED} AND {_AGREED}),
                   jp.total_reward, js.total_reward,
                   COALESCE(p.outcome->'injected_fault', s.outcome->'injected_fault')
            {SHADOW_PAIRS_FROM}
            ORDER BY p.id
            """
        ),
        {"c": candidate_id, "p": production_id, "s": since},
    ).all()
    return [(str(r[0]), int(r[1]), int(r[2]), float(r[3]), float(r[4]), r[5]) for r in rows]


def requested_batch_behaviour(
    *, session: Session, batch_id: str, checkpoint_id: str, purpose: str = Purpose.EVAL,
    task_ids: Sequence[str] | None = None,
) -> list[EpisodeBehaviour]:
    """The behaviour audit's view of the episodes ``requested_batch_outcomes`` counts.

    The same filter (``_counted_in_batch``): a batch governance asked for, for this purpose
    and checkpoint (else nothing), its planned episodes that this checkpoint served and the
    verifier judged, of ``task_ids`` when given. Each episode comes with the seed its plan
    names, its steps' action text and feedback, its verdict's details and the tokens the
    policy sampled.
    """
    counted, _ = _counted_in_batch(session=session, batch_id=batch_id,
                                   checkpoint_id=checkpoint_id, purpose=purpose,
                                   task_ids=task_ids)
    rows = session.execute(
        text("SELECT t.id, t.task_id, b.planned_episodes -> t.id ->> 'seed', v.success, "
             "t.status, t.failure_reason, v.details, "
             "CASE WHEN q.trajectory_id IS NOT NULL THEN "
             "(SELECT count(*) FROM unnest(q.action_mask) AS m WHERE m = 1) END "
             "FROM trajectory t JOIN rollout_batch b ON b.id = t.batch_id "
             f"JOIN verdict v ON v.trajectory_id = t.id AND v.recorded_by = '{VERIFIER_ROLE}' "
             "LEFT JOIN trajectory_sequence q ON q.trajectory_id = t.id "
             "WHERE t.id = ANY(:ids) ORDER BY t.id"),
        {"ids": [str(r[7]) for r in counted]},
    ).all()
    steps: dict[str, list[tuple[str, dict[str, Any] | None]]] = {str(r[0]): [] for r in rows}
    for trajectory_id, action_text, feedback in session.execute(
            text("SELECT trajectory_id, action_text, feedback FROM step "
                 "WHERE trajectory_id = ANY(:ids) ORDER BY trajectory_id, index"),
            {"ids": list(steps)}).all():
        steps[str(trajectory_id)].append((str(action_text), feedback))
    return [EpisodeBehaviour.of(
        task_id=str(r[1]), seed=None if r[2] is None else int(r[2]), success=bool(r[3]),
        status=str(r[4]), failure_reason=r[5], verdict_details=r[6], steps=steps[str(r[0])],
        # None: no token sequence is stored (rows written before sequences, test rows).
        action_tokens=None if r[7] is None else int(r[7]))
        for r in rows]


@dataclass(frozen=True)
class WindowTerms:
    """Reward terms of a window's judged episodes, and the tasks they played."""

    episodes: list[dict[str, float]]
    task_ids: list[str]
    successes: int  # the verifier's successes among them

    @property
    def success_rate(self) -> float:
        return self.successes / len(self.episodes) if self.episodes else 0.0


def window_terms(
    *, session: Session, checkpoint_id: str, purposes: Sequence[str], since: datetime,
    until: datetime | None = None, clean: bool = False,
) -> WindowTerms:
    """Each judged episode's reward split by term in a time window (as ``episode_counts``
    counts them)."""
    rows = session.execute(
        text("SELECT j.success, j.total_reward, j.terms, trajectory.task_id FROM trajectory "
             "CROSS JOIN LATERAL (SELECT v.success, v.total_reward, v.details->'terms' AS terms "
             "FROM verdict v WHERE v.trajectory_id = trajectory.id "
             f"AND v.recorded_by = '{VERIFIER_ROLE}') AS j "
             f"WHERE {_IN_WINDOW} AND {_CLEAN} AND {_requested_traffic('trajectory')} "
             "ORDER BY trajectory.id"),
        {"c": checkpoint_id, "p": list(purposes), "s": since, "u": until, "clean": clean},
    ).all()
    return WindowTerms([verdict_terms(r[2], success=bool(r[0]), total_reward=float(r[1]))
                        for r in rows], sorted({str(r[3]) for r in rows}),
                       sum(1 for r in rows if r[0]))


def shadow_pair_terms(
    *, session: Session, candidate_id: str, production_id: str, since: datetime
) -> tuple[WindowTerms, WindowTerms]:
    """(production's, the candidate shadow's) reward terms over the pairs ``shadow_pairs``
    counts, in the same order."""
    rows = session.execute(
        text(
            f"""
            SELECT jp.success, jp.total_reward, {_VERDICT_TERMS.format(alias='p')},
                   js.success, js.total_reward, {_VERDICT_TERMS.format(alias='s')}, p.task_id
            {SHADOW_PAIRS_FROM}
            ORDER BY p.id
            """
        ),
        {"c": candidate_id, "p": production_id, "s": since},
    ).all()
    tasks = sorted({str(r[6]) for r in rows})
    return (WindowTerms([verdict_terms(r[2], success=bool(r[0]), total_reward=float(r[1]))
                         for r in rows], tasks, sum(1 for r in rows if r[0])),
            WindowTerms([verdict_terms(r[5], success=bool(r[3]), total_reward=float(r[4]))
                         for r in rows], tasks, sum(1 for r in rows if r[3])))
