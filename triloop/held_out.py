"""Held out by construction: eval tasks and training tasks never share what a task *is*.

A task is an environment with a seed (its version adds fixtures and code, not a new
world: the same environment at the same seed is the same map, repository or problem). Two
tasks overlap when they share an id, or the same environment and seed under any version,
so a copy under a new task id, or a re-registered version, does not slip through.

Checked when an eval set is frozen (against every training run), when a run is submitted
(against every frozen eval set), and again by the offline-eval gate (the candidate's run
against its eval set), which records the check in its evidence.
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


def training_tasks(session: Session, *, run_id: str | None = None) -> list[str]:
    """Tasks named in the config of every training run (or of one run)."""
    rows = session.execute(text(
        "SELECT DISTINCT jsonb_array_elements_text(config->'rollout'->'task_ids') "
        "FROM training_run WHERE CAST(:r AS text) IS NULL OR id = :r"), {"r": run_id}).all()
    return [str(r[0]) for r in rows]


def require_held_out(*, session: Session, training: Sequence[str], evaluation: Sequence[str],
                     what: str) -> None:
    """Raise ``HeldOutViolation`` naming every overlap, if any."""
    found = overlaps(session=session, training=training, evaluation=evaluation)
    if found:
        raise HeldOutViolation(f"{what}: eval tasks must be held out from training; "
                               + "; ".join(o.describe() for o in found))
