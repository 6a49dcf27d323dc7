"""What a task is: environments take an item, and describe a task's content and tags."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from execution_loop.environments.base import GeneratedTask, TaskContent, fingerprint
from execution_loop.environments.fix_ci_failure import pinned_commits, repository_for
from execution_loop.environments.registry import (
    _BUILTINS,
    _Builtin,
    default_describe,
    describe_task,
    generate_tasks,
    get_environment,
    has_generator,
    load_builtin_contract,
    reference_solution,
)
from execution_loop.environments.tool_arithmetic import ToolArithmetic


def test_frozen_lake_seeds_43_and_190_draw_one_map_and_one_digest() -> None:
    contract = load_builtin_contract("frozen_lake")
    same = [describe_task(contract, seed) for seed in (43, 190)]
    assert same[0].digest == same[1].digest
    assert same[0].content["grid"] == get_environment("frozen_lake")().reset(43)
    assert describe_task(contract, 44).digest != same[0].digest
    assert same[0].digest == fingerprint(same[0].content)
    assert same[0].tags == {"size": "4", "holes": "3"}


def test_fix_ci_failure_seeds_with_one_repository_share_a_digest() -> None:
    contract = load_builtin_contract("fix_ci_failure")
    commits = pinned_commits(contract)
    assert repository_for(0, commits) == repository_for(3, commits)
    first, again, other = (describe_task(contract, seed) for seed in (0, 3, 1))
    assert first.digest == again.digest
    assert first.digest != other.digest
    assert first.tags == {"repository": repository_for(0, commits)}
    assert any(path.endswith(".py") and "test_" in path for path in first.content["files"])
    assert first.content["tests"]  # the failing tests are among the fixture's bytes


def test_tool_arithmetic_describes_its_problem_and_answer() -> None:
    contract = load_builtin_contract("tool_arithmetic")
    described = describe_task(contract, 7)
    assert described.content["answer"]
    assert describe_task(contract, 7).digest == described.digest


@pytest.mark.parametrize("name", ["frozen_lake", "tool_arithmetic", "fix_ci_failure"])
def test_builtins_refuse_an_item_they_cannot_play(name: str) -> None:
    env = get_environment(name)()
    try:
        with pytest.raises(ValueError, match=f"{name} takes no item"):
            env.reset(1, {"question": "2+2"})
    finally:
        env.close()
    with pytest.raises(ValueError, match="takes no item"):
        reference_solution(name, 1, item={"question": "2+2"})
    with pytest.raises(ValueError, match="takes no item"):
        describe_task(load_builtin_contract(name), 1, {"question": "2+2"})


def test_default_describe_is_the_initial_observation_and_state() -> None:
    contract = load_builtin_contract("tool_arithmetic")
    env = ToolArithmetic(contract)
    described = default_describe(env, 7, None)
    fresh = ToolArithmetic(contract)
    observation = fresh.reset(7)
    assert described.content == {"environment": "tool_arithmetic", "observation": observation,
                                 "state": fresh.state_fingerprint()}


class _Echo(ToolArithmetic):
    """An environment that plays items: its observation is the item's question."""

    def reset(self, seed: int, item: Mapping[str, Any] | None = None) -> str:
        super().reset(seed)
        self._observation = str((item or {}).get("question", ""))
        return self._observation


def _generate(params: Mapping[str, Any], contract: Any) -> Iterator[GeneratedTask]:
    for index in range(int(params["count"])):
        yield GeneratedTask(index, {"question": f"{index}+1"}, {"difficulty": "easy"})


def test_an_entry_without_describe_uses_the_default_with_the_item(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    base = _BUILTINS["tool_arithmetic"]
    monkeypatch.setitem(_BUILTINS, "tool_arithmetic", _Builtin(
        _Echo, base.capabilities, base.reference, generate=_generate))
    contract = load_builtin_contract("tool_arithmetic")
    one = describe_task(contract, 1, {"question": "2+2"}, factory=lambda c: _Echo(c))
    two = describe_task(contract, 1, {"question": "3+3"}, factory=lambda c: _Echo(c))
    assert one.content["observation"] == "2+2" and one.digest != two.digest
    assert has_generator("tool_arithmetic")
    made = list(generate_tasks(contract, {"count": 3}))
    assert [t.item for t in made] == [{"question": f"{i}+1"} for i in range(3)]
    with pytest.raises(ValueError, match="positive integer count"):
        generate_tasks(contract, {})


def test_generate_is_refused_for_an_environment_without_a_generator() -> None:
    assert not has_generator("frozen_lake")
    with pytest.raises(ValueError, match="frozen_lake has no generator"):
        generate_tasks(load_builtin_contract("frozen_lake"), {"count": 2})


def test_task_content_digest_ignores_key_order() -> None:
    assert TaskContent({"a": 1, "b": 2}).digest == TaskContent({"b": 2, "a": 1}).digest
