"""Comparing runs, the pure parts: the selection, the labels, the N-way config diff, the
overlaid charts' colours and legends, and the CLI's tables."""

from __future__ import annotations

import pytest

from web.cli_run_compare import last_value
from web.console.charts import PALETTE, compare_chart_data, run_chart_data
from web.data.run_compare import (
    MAX_COMPARED,
    ComparisonRefused,
    config_differences,
    parse_run_ids,
    run_labels,
)

TASK = "0123456789abcdef0123456789abcdef"  # a 32-character task id


def test_the_selection_reads_commas_and_repeats_in_order_once_each() -> None:
    assert parse_run_ids(["a,b", "c", "a", " b ,d"]) == ["a", "b", "c", "d"]
    with pytest.raises(ComparisonRefused, match="compare 2 to 8 different runs; 1 given"):
        parse_run_ids(["a,a"])
    with pytest.raises(ComparisonRefused, match="9 given"):
        parse_run_ids([",".join(f"r{i}" for i in range(MAX_COMPARED + 1))])
    with pytest.raises(ComparisonRefused, match="0 given"):
        parse_run_ids([" , "])


def test_labels_name_runs_by_name_or_short_id_and_submitter() -> None:
    runs = [("aaaaaaaa" + "1" * 24, "sweep", "ann"), ("bbbbbbbb" + "2" * 24, "sweep", "bo"),
            ("cccccccc" + "3" * 24, "", "cy"), ("dddddddd" + "4" * 24, "base", "ann")]
    assert run_labels(runs) == ["sweep · aaaaaaaa (ann)", "sweep · bbbbbbbb (bo)",
                                "cccccccc (cy)", "base (ann)"]


def test_config_diff_lists_only_differing_settings_one_value_per_run() -> None:
    a = {"name": "a", "rollout": {"group_size": 8, "task_ids": ["t1"], "temperature": 1.0},
         "schedule": {"iterations": 10}}
    b = {"name": "b", "rollout": {"group_size": 4, "task_ids": ["t1"], "temperature": 1},
         "schedule": {"iterations": 10}}
    c = {"name": "c", "rollout": {"group_size": 8, "task_ids": ["t1", "t2"],
                                  "temperature": 1.0}, "schedule": {"iterations": 10},
         "update": {"lora": {"rank": 8}}}
    diff = {d.path: (d.values, d.present) for d in config_differences([a, b, c])}
    assert list(diff) == ["name", "rollout.group_size", "rollout.task_ids",
                          "rollout.temperature", "update.lora.rank"]
    assert diff["rollout.group_size"] == ([8, 4, 8], [True, True, True])
    assert diff["rollout.task_ids"][0] == [["t1"], ["t1"], ["t1", "t2"]]  # lists whole
    assert diff["rollout.temperature"][0] == [1.0, 1, 1.0]  # 1 and 1.0 are stored apart
    assert diff["update.lora.rank"] == ([None, None, 8], [False, False, True])
    assert config_differences([a, dict(a)]) == []


def _points(n: int, reward: float, *, task: bool = False) -> list[dict[str, object]]:
    return [{"iteration": i + 1, "reward_mean": reward + i / 10, "alarms": [],
             "extra_metrics": {"success/rate": 0.5, **({f"reward/task/{TASK}": 0.1 * i}
                                                       if task else {})}}
            for i in range(n)]


def test_compared_charts_give_each_run_its_colour_and_legends_no_long_ids() -> None:
    data = compare_chart_data([("r1", "one (ann)", _points(3, 0.1, task=True)),
                               ("r2", "two (bo)", _points(5, 0.2)),
                               ("r3", "three (cy)", [])])
    assert [r.color for r in data.runs] == list(PALETTE[:3])
    assert len(set(PALETTE)) == len(PALETTE) >= MAX_COMPARED
    assert [r.label for r in data.runs] == ["one (ann)", "two (bo)", "three (cy)"]
    ids = [c.id for c in data.charts]
    assert ids[0] == "chart-reward-task" and "chart-reward-mean" in ids
    assert len(ids) == len(set(ids))  # each chart once, whichever runs have it
    reward = next(c for c in data.charts if c.id == "chart-reward-mean")
    assert reward.summary == ("Reward (mean): one (ann): last 0.3 at iteration 3; "
                              "two (bo): last 0.6 at iteration 5")
    per_task = data.charts[0]
    assert [s.label for s in per_task.series] == ["task 01234567…"]
    assert TASK not in per_task.summary  # the key keeps the id: the legend does not


def test_the_single_run_page_names_task_lines_by_a_short_id_too() -> None:
    data = run_chart_data(_points(2, 0.1, task=True))
    assert [s.label for s in data.charts[0].series] == ["task 01234567…"]


def test_the_cli_reads_the_last_value_of_a_column_or_a_keyed_series() -> None:
    points = [{"reward_mean": 0.1, "extra_metrics": {"success/rate": 0.25}},
              {"reward_mean": None, "extra_metrics": {}}]
    assert last_value(points, "reward_mean") == 0.1
    assert last_value(points, "success/rate") == 0.25
    assert last_value(points, "kl") is None
