"""Held out by construction: eval tasks and training tasks never share what a task *is*.

A task is an environment with a seed (its version adds fixtures and code, not a new
world: the same environment at the same seed is the same map, repository or problem). Two
tasks overlap when they share an id, or the same environment and seed under any version,
so a copy under a new task id, or a re-registered version, does not slip through.

Checked when an eval set is frozen (against every training run), when a run is submitted
(against every frozen eval set), and again by the offline-eval gate (the candidate's run
against its eval set), which records the check in its evidence. A run's training tasks are
those its config names and those its training batches actually asked for or played
(``rollout_batch.task_ids``, ``trajectory``): the learning worker need not follow its config.

Production traffic is held out too: execution's Nexus handler refuses a training batch on
a task of any frozen eval set or of production traffic (``held_out_conflicts``, the
database's own ``triloop_held_out_conflicts``, which its triggers also apply).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import text
from sqlmodel import Session

_IDENTITY = text(
    "SELECT t.id, v.environment_name, t.seed FROM task t "
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

    def describe(self) -> str:
        same = ("the same task" if self.training_task == self.eval_task
                else f"the same {self.environment} seed {self.seed} as eval task "
                     f"{self.eval_task}")
        return f"training task {self.training_task} is {same}"


def overlaps(*, session: Session, training: Sequence[str], evaluation: Sequence[str]
             ) -> list[Overlap]:
    """Every training task that shares an id or (environment, seed) with an eval task."""
    ids = sorted(set(training) | set(evaluation))
    identity = {str(r[0]): (str(r[1]), int(r[2]))
                for r in session.execute(_IDENTITY, {"ids": ids}).all()}
    by_world: dict[tuple[str, int], str] = {}
    for task in evaluation:
        by_world.setdefault(identity.get(task, ("", -1)), task)
    found = []
    for task in sorted(set(training)):
        world = identity.get(task)
        eval_task = task if task in evaluation else (by_world.get(world) if world else None)
        if eval_task is not None:
            environment, seed = world or ("", -1)
            found.append(Overlap(task, eval_task, environment, seed))
    return found


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
    held_by: str  # "frozen eval set <name> v<version>" or "production traffic"

    def describe(self) -> str:
        same = ("is held out" if self.task_id == self.held_task
                else f"is the same world as held-out task {self.held_task}")
        return (f"task {self.task_id} {same} ({self.environment} seed {self.seed}, in "
                f"{self.held_by})")

    def to_fact(self) -> dict[str, str]:
        """The conflict as a policy fact."""
        return {"task_id": self.task_id, "held_task": self.held_task, "held_by": self.held_by,
                "reason": self.describe()}


def held_out_conflicts(session: Session, task_ids: Sequence[str]) -> list[Conflict]:
    """Each of these tasks that shares an id, or an environment and seed, with a task of a
    frozen eval set or of production traffic (the database's own definition)."""
    rows = session.execute(text(
        "SELECT task_id, held_task, environment, seed, held_by "
        "FROM triloop_held_out_conflicts(CAST(:t AS text[]))"), {"t": sorted(set(task_ids))})
    return [Conflict(str(r[0]), str(r[1]), str(r[2]), int(r[3]), str(r[4])) for r in rows]


def require_held_out(*, session: Session, training: Sequence[str], evaluation: Sequence[str],
                     what: str) -> None:
    """Raise ``HeldOutViolation`` naming every overlap, if any."""
    found = overlaps(session=session, training=training, evaluation=evaluation)
    if found:
        raise HeldOutViolation(f"{what}: eval tasks must be held out from training; "
                               + "; ".join(o.describe() for o in found))
