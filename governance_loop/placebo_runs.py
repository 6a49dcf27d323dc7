"""Find a candidate's placebo: the newest completed placebo run of its run's config.

A placebo run (``triloop train placebo RUN``) is the candidate run's own config trained
with the task reward zeroed; which runs qualify is ``triloop.placebo.is_placebo_of``
(every setting but the name equal, ``advantage.zero_task_reward`` on). Its last checkpoint
(the highest iteration it wrote; retention always keeps the newest) is the placebo.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlmodel import Session, col, select

from triloop.models import Checkpoint, TrainingRun
from triloop.placebo import is_placebo_of
from triloop.statuses import RunStatus

# Placebo runs looked at, newest first: a run config has few placebos, and the JSON filter
# below already leaves out every run that is not one.
MAX_CANDIDATES = 200
_COMPLETED = (RunStatus.completed, RunStatus.completed_with_alarms)


@dataclass(frozen=True)
class FoundPlacebo:
    """A placebo run and its last checkpoint."""

    run_id: str
    checkpoint_id: str


def find_placebo(*, session: Session, run_id: str) -> FoundPlacebo | None:
    """The newest completed placebo run of ``run_id``'s config that wrote a checkpoint."""
    run = session.get(TrainingRun, run_id)
    if run is None:
        return None
    placebos = session.exec(
        select(TrainingRun)
        .where(col(TrainingRun.status).in_(_COMPLETED))
        .where(col(TrainingRun.id) != run_id)
        .where(col(TrainingRun.config)["advantage"]["zero_task_reward"].as_boolean())
        .order_by(col(TrainingRun.updated_at).desc().nulls_last(),
                  col(TrainingRun.created_at).desc())
        .limit(MAX_CANDIDATES))
    for placebo in placebos:
        if not is_placebo_of(run.config or {}, placebo.config or {}):
            continue
        last = session.exec(
            select(Checkpoint.id).where(Checkpoint.run_id == placebo.id)
            .order_by(col(Checkpoint.iteration).desc().nulls_last()).limit(1)).first()
        if last is not None:
            return FoundPlacebo(placebo.id, last)
    return None
