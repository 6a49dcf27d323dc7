"""Tags: the curriculum by tag (pure selection and its checks), per-tag reward and success
series, and the run page's per-tag rows."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from learning_loop.advantages import TrajectoryReturn
from learning_loop.batch_metrics import tag_series
from learning_loop.contracts import TaskSeed
from learning_loop.dynamic_data import curriculum_series, curriculum_tasks, rollout_items
from triloop.curriculum import curriculum_problems, matches, select, stage_at
from triloop.run_config import CurriculumStage, RunConfig, RunConfigError, run_config_from_data
from web.console.charts import run_chart_data
from web.data.runs import MetricPoint, tag_results

TAGS = {"e1": {"difficulty": "easy", "domain": "grid"},
        "e2": {"difficulty": "easy", "domain": "math"},
        "m1": {"difficulty": "medium", "domain": "grid"},
        "h1": {"difficulty": "hard", "domain": "math"},
        "plain": {}}
TASKS = [TaskSeed(task, n, "v", "lake", tags=tags) for n, (task, tags) in enumerate(TAGS.items())]
STAGES = [{"from_iteration": 1, "tags": {"difficulty": ["easy"]}},
          {"from_iteration": 5, "tags": {"difficulty": ["easy", "medium"]}},
          {"from_iteration": 9, "tags": {"difficulty": ["hard"], "domain": ["math"]}}]


def config(curriculum: list[dict[str, Any]], **rollout: Any) -> RunConfig:
    return run_config_from_data({"name": "r", "model": {"base": "m"}, "rollout": {
        "task_ids": list(TAGS), "groups_per_iteration": 3, "curriculum": curriculum,
        **rollout}})


def stage(**tags: list[str]) -> CurriculumStage:
    return CurriculumStage(from_iteration=1, tags=tags)


def test_a_task_matches_when_every_key_has_one_of_the_values() -> None:
    assert matches(stage(difficulty=["easy", "medium"]), TAGS["m1"])
    assert not matches(stage(difficulty=["easy"]), TAGS["m1"])
    assert matches(stage(difficulty=["hard"], domain=["math"]), TAGS["h1"])
    assert not matches(stage(difficulty=["easy"], domain=["math"]), TAGS["e1"])
    assert not matches(stage(difficulty=["easy"]), {})  # untagged: never selected by a key


def test_each_iteration_samples_the_last_stage_started() -> None:
    run = config(STAGES)
    picked = {i: [t.task_id for t in curriculum_tasks(TASKS, i, run)] for i in (1, 4, 5, 8, 9, 30)}
    assert picked == {1: ["e1", "e2"], 4: ["e1", "e2"], 5: ["e1", "e2", "m1"],
                      8: ["e1", "e2", "m1"], 9: ["h1"], 30: ["h1"]}
    # Rollout items cycle through the selected tasks only.
    items = rollout_items(curriculum_tasks(TASKS, 5, run), 5, 3, 2)
    assert {i.task_id for i in items} <= {"e1", "e2", "m1"}
    assert curriculum_series(5, run, 3) == {"curriculum/stage": 2.0, "curriculum/tasks": 3.0}


def test_before_the_first_stage_and_without_a_curriculum_every_task_is_sampled() -> None:
    later = config([{"from_iteration": 3, "tags": {"difficulty": ["hard"]}}])
    assert [t.task_id for t in curriculum_tasks(TASKS, 2, later)] == list(TAGS)
    assert curriculum_series(2, later, 5) == {"curriculum/stage": 0.0, "curriculum/tasks": 5.0}
    assert [t.task_id for t in curriculum_tasks(TASKS, 7, config([]))] == list(TAGS)
    assert curriculum_series(7, config([]), 5) == {}
    assert stage_at(2, later.rollout.curriculum) is None
    assert select(1, [], ["a"], lambda _: {}) == ["a"]


def test_stages_out_of_order_an_unknown_field_or_no_value_are_refused() -> None:
    with pytest.raises(RunConfigError) as order:
        config([STAGES[1], STAGES[0]])
    assert "rollout.curriculum" in str(order.value) and "[5, 1]" in str(order.value)
    with pytest.raises(RunConfigError) as twice:
        config([STAGES[0], STAGES[0]])
    assert "increasing iterations" in str(twice.value)
    with pytest.raises(RunConfigError) as unknown:
        config([{"from_iteration": 1, "tag": {"difficulty": ["easy"]}}])
    assert "rollout.curriculum[0].tag: unknown setting" in str(unknown.value)
    with pytest.raises(RunConfigError) as empty:
        config([{"from_iteration": 1, "tags": {"difficulty": []}}])
    assert "list no value" in str(empty.value)
    with pytest.raises(RunConfigError):
        config([{"from_iteration": 0, "tags": {"difficulty": ["easy"]}}])
    with pytest.raises(RunConfigError):
        config([{"from_iteration": 1, "tags": {}}])


def test_a_stage_is_checked_against_the_run_tasks_tags() -> None:
    assert curriculum_problems(config(STAGES).rollout.curriculum, TAGS) == []
    unknown_key = config([{"from_iteration": 2, "tags": {"level": ["1"]}}])
    (problem,) = curriculum_problems(unknown_key.rollout.curriculum, TAGS)
    assert problem.startswith("rollout.curriculum[0] (from iteration 2): tag key(s) ['level']")
    assert "difficulty, domain" in problem
    typo = config([STAGES[0], {"from_iteration": 3, "tags": {"difficulty": ["meduim"]}}])
    problems = curriculum_problems(typo.rollout.curriculum, TAGS)
    assert problems == [
        "rollout.curriculum[1] (from iteration 3): no task of the run carries"
        " difficulty=meduim",
        "rollout.curriculum[1] (from iteration 3): selects no task of the run"
        " (difficulty in [meduim])"]
    # Every value exists, but no one task has both.
    crossed = config([{"from_iteration": 1, "tags": {"difficulty": ["easy"],
                                                      "domain": ["nowhere", "grid"]}},
                      {"from_iteration": 4, "tags": {"difficulty": ["medium"],
                                                      "domain": ["math"]}}])
    problems = curriculum_problems(crossed.rollout.curriculum, TAGS)
    assert problems == [
        "rollout.curriculum[0] (from iteration 1): no task of the run carries domain=nowhere",
        "rollout.curriculum[1] (from iteration 4): selects no task of the run"
        " (difficulty in [medium]; domain in [math])"]
    assert "none" in curriculum_problems(unknown_key.rollout.curriculum, {"t": {}})[0]


def test_reward_and_success_per_tag_value() -> None:
    returns = [
        TrajectoryReturn("a", "g1", "e1", 1.0, "lake", success=True),
        TrajectoryReturn("b", "g1", "e1", 0.0, "lake", success=False),
        TrajectoryReturn("c", "g2", "h1", 0.5, "lake", success=None),  # verdict unknown
        TrajectoryReturn("d", "g3", "plain", 9.0, "lake", success=True),  # no tags
        TrajectoryReturn("e", "g4", "gone", 9.0, "lake", success=True),  # not in the plan
    ]
    assert tag_series(returns, TAGS) == pytest.approx({
        "reward/tag/difficulty=easy": 0.5, "reward/tag/difficulty=hard": 0.5,
        "reward/tag/domain=grid": 0.5, "reward/tag/domain=math": 0.5,
        "success/tag/difficulty=easy": 0.5, "success/tag/domain=grid": 0.5,
    })
    assert tag_series(returns, {}) == {}


def point(iteration: int, **series: float) -> MetricPoint:
    return MetricPoint(iteration=iteration, alarms=[], created_at=datetime(2026, 1, 1, tzinfo=UTC),
                       extra_metrics=series)


def test_the_run_detail_shows_each_tag_at_its_latest_iteration_and_the_page_charts_it() -> None:
    points = [point(1, **{"reward/tag/difficulty=easy": 0.2, "success/tag/difficulty=easy": 0.0}),
              point(2, **{"reward/tag/difficulty=easy": 0.6, "success/tag/difficulty=easy": 0.5,
                          "reward/tag/difficulty=hard": 0.1}),
              point(3, **{"reward/tag/difficulty=hard": 0.3})]
    rows = {r.tag: r for r in tag_results(points)}
    assert set(rows) == {"difficulty=easy", "difficulty=hard"}
    easy, hard = rows["difficulty=easy"], rows["difficulty=hard"]
    assert (easy.key, easy.value, easy.reward, easy.success, easy.iteration) == (
        "difficulty", "easy", 0.6, 0.5, 2)
    # Iteration 3 had no known verdicts for hard: no stale success from an older one.
    assert (hard.reward, hard.success, hard.iteration) == (0.3, None, 3)
    titles = {c.title: [s.key for s in c.series]
              for c in run_chart_data([p.model_dump() for p in points]).charts}
    assert titles["Reward per tag"] == ["reward/tag/difficulty=easy", "reward/tag/difficulty=hard"]
    assert titles["Success rate per tag"] == ["success/tag/difficulty=easy"]
