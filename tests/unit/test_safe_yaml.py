"""YAML from clients is parsed with aliases refused; long input is never echoed back whole."""

from __future__ import annotations

from pathlib import Path

import pytest

from triloop.contracts import validate_contract_text
from triloop.run_config import RunConfigError, load_run_config, run_config_from_data
from triloop.safe_yaml import YamlAliasRefused, YamlTooDeep, safe_load
from web.problems import MAX_REASONS, ProblemError

LAUGHS = "a: &a [lol, lol]\nb: &b [*a, *a]\n"


def test_aliases_and_merge_keys_are_refused_with_their_line() -> None:
    with pytest.raises(YamlAliasRefused) as caught:
        safe_load(LAUGHS)
    assert caught.value.problem_mark is not None and caught.value.problem_mark.line == 1
    with pytest.raises(YamlAliasRefused):
        safe_load("base: &base {x: 1}\nother:\n  <<: *base\n")
    assert safe_load("anchored: &only-anchor 1\n") == {"anchored": 1}  # an unused anchor is fine


def test_nesting_too_deep_is_refused_not_a_crash() -> None:
    with pytest.raises(YamlTooDeep):
        safe_load("[" * 50_000 + "]" * 50_000)


def test_run_config_refuses_an_alias_bomb() -> None:
    with pytest.raises(RunConfigError) as caught:
        load_run_config(LAUGHS + "name: x\nmodel: {base: t}\nrollout: {task_ids: *b}\n")
    (problem,) = caught.value.problems
    assert problem.path == "(yaml)" and "refused at line 2" in problem.message
    assert "aliases are not accepted" in problem.message


def test_run_config_echoes_at_most_a_short_piece_of_a_huge_value() -> None:
    with pytest.raises(RunConfigError) as caught:
        run_config_from_data({"name": "n" * 10_000_000, "model": {"base": "t"},
                              "rollout": {"task_ids": ["t"] * 20_000}})
    messages = {p.path: p.message for p in caught.value.problems}
    assert set(messages) == {"name", "rollout.task_ids"}
    assert all(len(m) < 300 for m in messages.values())


def test_contracts_refuse_aliases() -> None:
    problems = validate_contract_text(LAUGHS, base_dir=Path("."))
    assert len(problems) == 1 and problems[0].line == 2
    assert "YAML refused" in problems[0].message


def test_problem_documents_cut_echoed_input_short() -> None:
    problem = ProblemError(422, "Invalid input", "d" * 100_000,
                           reasons=["r" * 100_000] * (MAX_REASONS + 10)).problem()
    assert len(problem.detail) < 2100 and "more characters not shown" in problem.detail
    assert problem.reasons is not None and len(problem.reasons) == MAX_REASONS + 1
    assert problem.reasons[-1] == "… and 10 more problems"
    assert all(len(reason) < 600 for reason in problem.reasons)
