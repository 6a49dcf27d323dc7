"""The reasoning_gym environment: generated items, their content and tags, and verdicts from
each dataset's own score_answer in the verifier's process (against the real package)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest

from execution_loop.environments import reasoning_gym as rg
from execution_loop.environments.registry import (
    describe_task,
    generate_tasks,
    get_environment,
    load_builtin_contract,
    reference_solution,
)
from execution_loop.reward_hacks import ANSWER_HACKS, probe_reward_hacks
from execution_loop.verification import VerifierRequest, run_verifiers
from triloop.environment_code import environment_code_hashes, environment_verifier_hash

CONTRACT = load_builtin_contract("reasoning_gym")


def items(dataset: str, count: int = 3, seed: int = 7, **config: Any) -> list[dict[str, Any]]:
    params = {"dataset": dataset, "count": count, "seed": seed, "config": config}
    return [t.item for t in rg.generate(params, CONTRACT) if t.item is not None]


def test_generation_is_deterministic_and_a_thousand_items_are_json() -> None:
    params = {"dataset": "basic_arithmetic", "count": 1000, "seed": 11, "config": {}}
    first = list(generate_tasks(CONTRACT, params))
    assert [t.seed for t in first] == list(range(1000))
    assert first == list(generate_tasks(CONTRACT, params))  # the same params, the same tasks
    assert all(json.loads(json.dumps(t.item)) == t.item for t in first)
    digests = {describe_task(CONTRACT, t.seed, t.item).digest for t in first}
    assert len(digests) == 1000  # basic_arithmetic's space is large: no duplicate in 1,000
    other = list(generate_tasks(CONTRACT, {**params, "seed": 12, "count": 5}))
    assert [t.item for t in other] != [t.item for t in first[:5]]
    task = first[0]
    assert task.item is not None and set(task.item) == {*rg.ITEM_KEYS, "source"}
    assert task.item["source"] == {"seed": 11, "index": 0,
                                   "module": "reasoning_gym.arithmetic.basic_arithmetic"}
    assert task.tags == {"domain": "arithmetic", "capability": "basic_arithmetic",
                         "difficulty": "num_digits=1-4,num_terms=2-6"}


def test_describe_gives_question_answer_dataset_config_and_tags() -> None:
    [item] = items("basic_arithmetic", count=1, max_terms=3)
    content = describe_task(CONTRACT, 0, item)
    assert dict(content.content) == {
        "environment": "reasoning_gym", "dataset": "basic_arithmetic",
        "config": {"max_terms": 3}, "question": item["question"], "answer": item["answer"]}
    assert content.tags["capability"] == "basic_arithmetic"
    assert content.tags["domain"] == "arithmetic"
    assert content.tags["difficulty"] == "num_digits=1-4,num_terms=2-3"  # from the config
    # The seed only numbers the task: the same item under another seed is the same task.
    assert describe_task(CONTRACT, 99, item).digest == content.digest
    [bitwise] = items("bitwise_arithmetic", count=1, difficulty=3)
    assert describe_task(CONTRACT, 0, bitwise).tags == {
        "domain": "arithmetic", "capability": "bitwise_arithmetic", "difficulty": "3"}


@pytest.mark.parametrize(("params", "message"), [
    ({"dataset": "no_such_dataset", "count": 2}, "no dataset 'no_such_dataset'"),
    ({"dataset": "basic_arithmetic", "count": 0}, "positive integer count"),
    ({"dataset": "basic_arithmetic", "count": 2, "shuffle": True}, "unknown parameter.*shuffle"),
    ({"count": 2}, "needs 'dataset'"),
    ({"dataset": "basic_arithmetic", "count": 2, "config": {"seed": 3}}, "may not set seed"),
    ({"dataset": "basic_arithmetic", "count": 2, "config": {"max_termz": 3}}, "refuses config"),
])
def test_bad_generator_params_are_refused_by_name(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        list(generate_tasks(CONTRACT, params))


def test_the_item_is_required_and_checked() -> None:
    env = get_environment("reasoning_gym")()
    with pytest.raises(ValueError, match="needs a task item"):
        env.reset(0)
    with pytest.raises(ValueError, match="lacks answer, metadata"):
        env.reset(0, {"dataset": "basic_arithmetic", "config": {}, "question": "1+1?"})
    [item] = items("basic_arithmetic", count=1)
    first = env.reset(5, item)
    assert first.startswith(item["question"]) and "answer: <your answer>" in first
    fingerprint = env.state_fingerprint()
    env.step("answer: 0")
    env.reset(5, item)
    assert env.state_fingerprint() == fingerprint  # a reset recovers the same state
    assert reference_solution("reasoning_gym", 5, CONTRACT, item=item) == [
        f"answer: {item['answer']}"]


def request(item: Mapping[str, Any], answer: str | None) -> VerifierRequest:
    env = get_environment("reasoning_gym")()
    env.reset(0, item)
    if answer is not None:
        env.step(answer)
    return env.verifier_request()  # type: ignore[attr-defined, no-any-return]


def test_verdicts_come_from_the_datasets_score_answer_in_the_verifier_process() -> None:
    [arithmetic] = items("basic_arithmetic", count=1)
    [arc] = items("arc_agi", count=1)  # scores grids as tuples: the entry is made again
    [factors] = items("prime_factorization", count=1)  # its scorer raises on a non-number
    from_file = {k: v for k, v in arithmetic.items() if k != "source"}  # a dataset file's
    requests = [
        request(arithmetic, f"answer: {arithmetic['answer']}"),
        request(arithmetic, "answer: 123456789"),
        request(arithmetic, "the answer is four"),  # no 'answer:': nothing to score
        request(arc, f"answer: {arc['answer']}"),
        request(factors, "answer: banana"),
        request(from_file, f"<answer>{arithmetic['answer']}</answer>"),
    ]
    right, wrong, unformatted, grid, unscorable, filed = run_verifiers(requests)
    assert right.success and right.reward == 1.0 and right.details["remade"]
    assert not wrong.success and wrong.reward == 0.0 and wrong.details["reason"] == "wrong_answer"
    assert not unformatted.success and unformatted.details["reason"] == "no_answer"
    assert grid.success, grid.details
    assert not unscorable.success and unscorable.details["reason"] == "unscorable_answer"
    assert filed.success and not filed.details["remade"]


def test_an_episode_is_one_turn_judged_out_of_process() -> None:
    [item] = items("leg_counting", count=1)
    env = get_environment("reasoning_gym")()
    env.reset(3, item)
    [action] = reference_solution("reasoning_gym", 3, CONTRACT, item=item)
    result = env.step(action)
    assert result.done and result.feedback["valid_action"]
    outcome = env.outcome()
    assert outcome.success and outcome.reward == 1.0 and outcome.details["score"] == 1.0


def test_answers_that_know_nothing_earn_nothing() -> None:
    [item] = items("basic_arithmetic", count=1)
    trials = probe_reward_hacks(lambda: get_environment("reasoning_gym")(), 0, item=item)
    answers = {t.hack: t for t in trials if t.applicable}
    assert sorted(answers) == sorted(h.name for h in ANSWER_HACKS)  # no working copy to edit
    assert not any(t.rewarded for t in trials), trials


def test_the_probe_catches_a_dataset_whose_scorer_pays_any_answer() -> None:
    # reasoning-gym 0.1.25's game_of_life_halting scores bool(answer) == bool(expected):
    # any non-empty text earns 1.0. Admission must see it, not train on it.
    [item] = items("game_of_life_halting", count=1)
    trials = probe_reward_hacks(lambda: get_environment("reasoning_gym")(), 0, item=item)
    assert {t.hack for t in trials if t.rewarded} >= {"non_answer", "every_candidate_answer"}


def test_partial_credit_pays_for_containing_the_answer_when_the_contract_says_so() -> None:
    # reasoning-gym's default scorer pays len(expected)/len(answer) for an answer that
    # contains the expected one: a contract paying partial credit is then gamed.
    item = next(i for i in items("basic_arithmetic", count=50)
                if -20 <= int(i["answer"]) <= 100)
    data = CONTRACT.model_dump()
    data["reward"]["outcome"]["partial_credit"] = 0.5
    generous = type(CONTRACT).model_validate(data)
    env = get_environment("reasoning_gym")(generous)
    trials = probe_reward_hacks(lambda: env, 0, item=item)
    assert [t.hack for t in trials if t.rewarded] == ["every_candidate_answer"]


def test_the_installed_reasoning_gym_is_in_the_version_and_the_verifier_hash() -> None:
    code = environment_code_hashes("reasoning_gym")
    assert "execution_loop.environments.reasoning_gym" in code
    assert "distribution:reasoning-gym" in code
    assert environment_verifier_hash("reasoning_gym") is not None
