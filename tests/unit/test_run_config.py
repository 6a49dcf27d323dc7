"""RUN.yaml validation: defaults, every problem listed with its dotted path, torch-free import."""

from __future__ import annotations

import subprocess
import sys

import pytest

from triloop.run_config import RunConfig, RunConfigError, load_run_config

MINIMAL = """
name: tiny text game
model: {base: .triloop/models/tiny}
rollout: {task_ids: [guess-7]}
"""


def problems(text: str) -> dict[str, str]:
    with pytest.raises(RunConfigError) as info:
        load_run_config(text)
    return {p.path: p.message for p in info.value.problems}


def test_minimal_config_gets_documented_defaults() -> None:
    config = load_run_config(MINIMAL)
    assert config.rollout.group_size == 8
    assert config.objective.clip_eps_low == 0.2 and config.objective.clip_eps_high == 0.28
    assert config.objective.aggregation == "token" and config.objective.kl_coef == 0.0
    assert config.update.stale_samples == "drop"
    assert config.schedule.propose_every == 5


def test_full_config_round_trips() -> None:
    text = MINIMAL + """
advantage: {scale_by_group_std: false, task_normalization: true}
objective: {clip_eps_low: 0.1, clip_eps_high: 0.3, aggregation: sequence, kl_coef: 0.05}
optimizer: {learning_rate: 0.001, warmup_steps: 2}
update: {micro_batch_size: 4, max_staleness: 2, stale_samples: importance_correct}
stability: {echo_window: 4, pause_on_alarm: false}
schedule: {iterations: 20, propose_every: 10, seed: 3}
"""
    config = load_run_config(text)
    assert config.objective.aggregation == "sequence"
    assert config.update.stale_samples == "importance_correct"
    assert RunConfig.model_validate(config.model_dump()) == config


def test_every_field_problem_is_listed_with_its_path() -> None:
    found = problems("""
name: ""
model: {}
rollout: {task_ids: [ok, [nested]], group_size: 1, temperatur: 0.7}
objective: {clip_eps_low: 1.5, aggregation: tokens}
update: {stale_samples: keep}
""")
    assert set(found) == {
        "name", "model.base", "rollout.task_ids[1]", "rollout.group_size",
        "rollout.temperatur", "objective.clip_eps_low", "objective.aggregation",
        "update.stale_samples",
    }
    assert found["model.base"] == "Field required"
    assert "unknown setting" in found["rollout.temperatur"]
    assert "greater than or equal to 2" in found["rollout.group_size"]
    assert "(got 1.5)" in found["objective.clip_eps_low"]


def test_numbers_must_be_finite() -> None:
    found = problems("name: x\nmodel: {base: m}\nrollout: {task_ids: [a], deadline_s: .inf}\n"
                     "objective: {kl_coef: .nan}\n")
    assert set(found) == {"rollout.deadline_s", "objective.kl_coef"}
    assert "finite" in found["rollout.deadline_s"]


def test_cross_field_problems_are_listed_with_paths() -> None:
    with pytest.raises(RunConfigError) as info:
        load_run_config("""
name: x
model: {base: m}
rollout: {task_ids: [a], group_size: 2, groups_per_iteration: 1}
update: {optimizer_steps_per_batch: 3}
schedule: {iterations: 4, propose_every: 6}
""")
    found = [(p.path, p.message) for p in info.value.problems]
    assert [path for path, _ in found] == [
        "schedule.propose_every", "update.optimizer_steps_per_batch",
    ]
    assert "never propose" in found[0][1]
    assert "2 trajectories" in found[1][1]


def test_a_checkpoint_interval_is_refused_by_name() -> None:
    # Every iteration writes its checkpoint (the next rollouts are served from it), so the
    # setting that promised otherwise is gone; a config that still sets it is told so.
    with pytest.raises(RunConfigError) as info:
        load_run_config("""
name: x
model: {base: m}
rollout: {task_ids: [a]}
schedule: {iterations: 4, propose_every: 2, checkpoint_every: 2}
""")
    assert [p.path for p in info.value.problems] == ["schedule.checkpoint_every"]


def test_error_message_lists_everything() -> None:
    with pytest.raises(RunConfigError) as info:
        load_run_config("name: x\nrollout: {task_ids: []}\n")
    text = str(info.value)
    assert "2 problem(s)" in text and "  - model: Field required" in text
    assert "rollout.task_ids" in text


def test_constructing_in_python_checks_cross_fields_too() -> None:
    with pytest.raises(RunConfigError, match="schedule.propose_every"):
        RunConfig.model_validate({
            "name": "x", "model": {"base": "m"}, "rollout": {"task_ids": ["t"]},
            "schedule": {"iterations": 2, "propose_every": 3},
        })


@pytest.mark.parametrize(
    ("text", "path", "fragment"),
    [
        ("name: [unclosed\n", "(yaml)", "line 2"),
        ("", "(root)", "empty document"),
        ("- a\n- b\n", "(root)", "got list"),
    ],
)
def test_unusable_documents(text: str, path: str, fragment: str) -> None:
    found = problems(text)
    assert list(found) == [path] and fragment in found[path]


def test_torch_free_modules_do_not_import_torch() -> None:
    code = (
        "import sys, learning_loop, triloop.run_config, learning_loop.advantages,"
        " learning_loop.stability; assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_the_readmes_run_yaml_is_the_example_file_and_says_how_alarms_are_handled() -> None:
    """What the README prints is what `make demo` runs: nothing is switched off elsewhere."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    readme = (root / "README.md").read_text()
    section = readme[readme.index("`examples/tiny-frozen-lake.run.yaml` is the one"):]
    printed = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert printed is not None
    shown = load_run_config(printed.group(1))
    example = load_run_config((root / "examples" / "tiny-frozen-lake.run.yaml").read_text())
    assert shown == example
    # The setting the demo needs is in the file, and the README explains it and the way on.
    assert example.stability.pause_on_alarm is False
    for words in ("pause_on_alarm", "triloop train resume RUN_ID", "completed_with_alarms",
                  "override-alarms"):
        assert words in readme
    demo = (root / "scripts" / "demo.py").read_text()
    assert "pause_on_alarm" not in demo
