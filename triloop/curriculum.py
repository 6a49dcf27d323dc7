"""Curriculum by tag (``rollout.curriculum``): which of a run's training tasks an iteration
samples, from the tasks' tags (``task.tags``). Pure functions.

A stage starts at ``from_iteration`` and selects the tasks whose tags match it: for every
key of the stage, the task carries that key with one of the stage's values. Before the
first stage every task is sampled; after it, the last stage started applies, as
``sampling.horizon_schedule`` does for ``max_turns``. The web service checks a curriculum
against the run's tasks when the run is submitted (``curriculum_problems``), and the
training workflow checks it again against the run plan before its first rollout, so a
stage never leaves an iteration with nothing to sample.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from triloop.run_config import CurriculumStage

T = TypeVar("T")


def matches(stage: CurriculumStage, tags: Mapping[str, str]) -> bool:
    """Whether a task with these tags is sampled in this stage."""
    return all(tags.get(key) in values for key, values in stage.tags.items())


def stage_at(iteration: int, stages: Sequence[CurriculumStage]) -> CurriculumStage | None:
    """The last stage started by ``iteration`` (None: before the first, or no curriculum)."""
    current = None
    for stage in stages:
        if stage.from_iteration <= iteration:
            current = stage
    return current


def select(iteration: int, stages: Sequence[CurriculumStage], tasks: Sequence[T],
           tags_of: Callable[[T], Mapping[str, str]]) -> list[T]:
    """The tasks the iteration samples, in their order (``tags_of``: a task's tags)."""
    stage = stage_at(iteration, stages)
    if stage is None:
        return list(tasks)
    return [t for t in tasks if matches(stage, tags_of(t))]


def curriculum_problems(stages: Sequence[CurriculumStage],
                        tags_of: Mapping[str, Mapping[str, str]]) -> list[str]:
    """What is wrong with these stages for a run whose tasks carry these tags (task id ->
    tags): a tag key none of them carries, a value none has, a stage selecting none."""
    problems: list[str] = []
    carried: dict[str, set[str]] = {}
    for tags in tags_of.values():
        for key, value in tags.items():
            carried.setdefault(key, set()).add(value)
    for index, stage in enumerate(stages):
        where = f"rollout.curriculum[{index}] (from iteration {stage.from_iteration})"
        unknown = sorted(set(stage.tags) - set(carried))
        if unknown:
            known = ", ".join(sorted(carried)) or "none"
            problems.append(f"{where}: tag key(s) {unknown} are on none of the run's tasks"
                            f" (their tag keys: {known})")
            continue
        absent = sorted(f"{key}={value}" for key, values in stage.tags.items()
                        for value in values if value not in carried[key])
        if absent:
            problems.append(f"{where}: no task of the run carries {', '.join(absent)}")
        if not any(matches(stage, tags) for tags in tags_of.values()):
            problems.append(f"{where}: selects no task of the run ({_describe(stage)})")
    return problems


def _describe(stage: CurriculumStage) -> str:
    return "; ".join(f"{key} in [{', '.join(values)}]" for key, values in stage.tags.items())
