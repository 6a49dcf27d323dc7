"""Held out by construction: eval tasks and training tasks never share what a task *is*.

A task is what the agent sees and the verifier checks: its content digest
(``task.content_digest``, computed by the execution loop from the environment's
``describe``). Two tasks overlap when they share an id, the same environment, seed and item
under any version (a version adds fixtures and code, not a new world), or equal content
digests (both known), so a copy under a new task id, a re-registered version, or another
seed that draws the same map or repository (frozen_lake 43 and 190, fix_ci_failure 0 and 3)
does not slip through.

Checked when an eval set is frozen (against every training run), when a run is submitted
(against every frozen eval set), and again by the offline-eval gate (the candidate's run
against its eval set), which records the check in its evidence. A run's training tasks are
those its config names and those its training batches actually asked for or played
(``rollout_batch.task_ids``, ``trajectory``): the learning worker need not follow its config.

Production traffic is held out too (episodes served in production, and the tasks of a task
set's traffic split): execution's Nexus handler refuses a training batch on a task of any
frozen eval set or of production traffic (``held_out_conflicts``, the
database's own ``triloop_held_out_conflicts``, which its triggers also apply).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import text
from sqlmodel import Session

_IDENTITY = text(
    "SELECT t.id, v.environment_name, t.seed, t.item, t.content_digest FROM task t "
    "JOIN environment_version v ON v.id = t.environment_version_id WHERE t.id = ANY(:ids)"
)


class HeldOutViolation(ValueError):
    """Eval and training tasks overlap; the message names each shared task."""


@dataclass(frozen=True)
class Overlap:
    """One training task that is, in truth, an eval task."""

    training_task: str
    eval_task: str
    environment: str
    seed: int
    content_digest: str | None = None  # set when the two share content, not a seed

    def describe(self) -> str:
        if self.training_task == self.eval_task:
            same = "the same task"
        elif self.content_digest is not None:
            same = (f"the same content (digest {self.content_digest}) as eval task "
                    f"{self.eval_task}")
        else:
            same = f"the same {self.environment} seed {self.seed} as eval task {self.eval_task}"
        return f"training task {self.training_task} is {same}"


@dataclass(frozen=True)
class _Identity:
    environment: str
    seed: int
    item: str  # the item as canonical JSON ("" for none)
    digest: str | None


def _identities(session: Session, ids: Sequence[str]) -> dict[str, _Identity]:
    rows = session.execute(_IDENTITY, {"ids": sorted(set(ids))}).all()
    return {str(r[0]): _Identity(str(r[1]), int(r[2]),
                                 "" if r[3] is None else json.dumps(r[3], sort_keys=True),
                                 None if r[4] is None else str(r[4])) for r in rows}


def overlaps(*, session: Session, training: Sequence[str], evaluation: Sequence[str]
             ) -> list[Overlap]:
    """Every training task that shares an id, (environment, seed, item) or a content
    digest with an eval task."""
    identity = _identities(session, [*training, *evaluation])
    by_world: dict[tuple[str, int, str], str] = {}
    by_digest: dict[str, str] = {}
    for task in evaluation:
        known = identity.get(task)
        if known is not None:
            by_world.setdefault((known.environment, known.seed, known.item), task)
            if known.digest is not None:
                by_digest.setdefault(known.digest, task)
    found = []
    for task in sorted(set(training)):
        known = identity.get(task)
        if task in evaluation:
            environment, seed = (known.environment, known.seed) if known else ("", -1)
            found.append(Overlap(task, task, environment, seed))
        elif known is None:
            continue
        elif known.digest is not None and known.digest in by_digest:
            found.append(Overlap(task, by_digest[known.digest], known.environment, known.seed,
                                 known.digest))
        elif (known.environment, known.seed, known.item) in by_world:
            found.append(Overlap(task, by_world[(known.environment, known.seed, known.item)],
                                 known.environment, known.seed))
    return found


def digest_check(*, session: Session, training: Sequence[str], evaluation: Sequence[str]
                 ) -> dict[str, object]:
    """What the content-digest comparison saw, for the offline-eval gate's evidence: how
    many tasks on each side have a digest (a task without one is compared by seed only),
    and each digest both sides share."""
    identity = _identities(session, [*training, *evaluation])

    def digests(tasks: Sequence[str]) -> dict[str, str]:
        return {t: d for t in set(tasks) if (d := getattr(identity.get(t), "digest", None))}

    trained, judged = digests(training), digests(evaluation)
    shared = sorted(set(trained.values()) & set(judged.values()))
    return {"training_with_digest": len(trained), "training_without_digest":
            len(set(training)) - len(trained), "eval_with_digest": len(judged),
            "eval_without_digest": len(set(evaluation)) - len(judged),
            "shared_digests": shared}


def frozen_eval_tasks(session: Session) -> list[str]:
    """Tasks of every frozen eval set."""
    rows = session.execute(text(
        "SELECT DISTINCT i.task_id FROM eval_item i JOIN eval_set s ON s.id = i.eval_set_id "
        "WHERE s.frozen_at IS NOT NULL")).all()
    return [str(r[0]) for r in rows]


# A run's training tasks: named in its config, asked for by its training batches, or played
# in them (by the run, or on one of its checkpoints).
_TRAINING_TASKS = text("""
    SELECT jsonb_array_elements_text(config->'rollout'->'task_ids') FROM training_run
    WHERE CAST(:r AS text) IS NULL OR id = :r
    UNION
    SELECT unnest(b.task_ids) FROM rollout_batch b WHERE b.purpose = 'training'
      AND (CAST(:r AS text) IS NULL OR b.run_id = :r
           OR b.checkpoint_id IN (SELECT id FROM checkpoint WHERE run_id = :r))
    UNION
    SELECT t.task_id FROM trajectory t WHERE t.purpose = 'training'
      AND (CAST(:r AS text) IS NULL OR t.run_id = :r
           OR t.checkpoint_id IN (SELECT id FROM checkpoint WHERE run_id = :r))
""")


def training_tasks(session: Session, *, run_id: str | None = None) -> list[str]:
    """Tasks every training run (or one run) named in its config or trained on in fact."""
    rows = session.execute(_TRAINING_TASKS, {"r": run_id}).all()
    return sorted({str(r[0]) for r in rows})


@dataclass(frozen=True)
class Conflict:
    """A task a training batch asks for that is held out: for eval, or production traffic."""

    task_id: str
    held_task: str
    environment: str
    seed: int
    held_by: str  # "frozen eval set <name> v<version>", "production traffic", a traffic split
    content_digest: str | None = None  # set when the two share content, not a seed

    def describe(self) -> str:
        if self.task_id == self.held_task:
            same = "is held out"
        elif self.content_digest is not None:
            same = (f"is the same content (digest {self.content_digest}) as held-out task "
                    f"{self.held_task}")
        else:
            same = f"is the same world as held-out task {self.held_task}"
        return (f"task {self.task_id} {same} ({self.environment} seed {self.seed}, in "
                f"{self.held_by})")

    def to_fact(self) -> dict[str, str]:
        """The conflict as a policy fact."""
        return {"task_id": self.task_id, "held_task": self.held_task, "held_by": self.held_by,
                "reason": self.describe()}


def held_out_conflicts(session: Session, task_ids: Sequence[str]) -> list[Conflict]:
    """Each of these tasks that shares an id, an environment, seed and item, or a content
    digest with a task of a frozen eval set, of production traffic or of a task set's
    traffic split (the database's own definition)."""
    rows = session.execute(text(
        "SELECT task_id, held_task, environment, seed, held_by, content_digest "
        "FROM triloop_held_out_conflicts(CAST(:t AS text[]))"), {"t": sorted(set(task_ids))})
    return [Conflict(str(r[0]), str(r[1]), str(r[2]), int(r[3]), str(r[4]),
                     None if r[5] is None else str(r[5])) for r in rows]


def require_held_out(*, session: Session, training: Sequence[str], evaluation: Sequence[str],
                     what: str) -> None:
    """Raise ``HeldOutViolation`` naming every overlap, if any."""
    found = overlaps(session=session, training=training, evaluation=evaluation)
    if found:
        raise HeldOutViolation(f"{what}: eval tasks must be held out from training; "
                               + "; ".join(o.describe() for o in found))
