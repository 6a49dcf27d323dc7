"""Environment contract diff: nested keys, aligned lists, strict scalar types, rendering."""

from __future__ import annotations

from typing import Any

import pytest

from triloop.contract_diff import (
    ChangeKind,
    ContractChange,
    ContractDiffError,
    diff_contracts,
    render_diff,
)


@pytest.fixture
def contract() -> dict[str, Any]:
    return {
        "task": "fix_ci_failure",
        "initial_state": {"repository": "immutable_commit", "dependencies": "locked"},
        "observations": ["ci_log", "test_report", "command_exit_code"],
        "allowed_actions": ["edit_source", "retry_ci", "skip_test"],
        "success_criteria": {"all_tests_pass": True, "coverage_drop_lt": 0.5},
        "limits": {"max_turns": 8},
        "reward": [{"name": "pass", "weight": 1.0}, {"name": "speed", "weight": 0.1}],
    }


def change(path: str, kind: str, old: Any, new: Any) -> ContractChange:
    return ContractChange(path, ChangeKind(kind), old, new)


def test_identical_contracts_have_no_changes(contract: dict[str, Any]) -> None:
    assert diff_contracts(contract, dict(contract)) == []
    assert render_diff([]) == "no changes"


def test_nested_keys_added_removed_changed(contract: dict[str, Any]) -> None:
    b = {**contract, "limits": {"max_turns": 10, "max_seconds": 60},
         "initial_state": {"repository": "immutable_commit"}}
    del b["task"]
    assert diff_contracts(contract, b) == [
        change("initial_state.dependencies", "removed", "locked", None),
        change("limits.max_seconds", "added", None, 60),
        change("limits.max_turns", "changed", 8, 10),
        change("task", "removed", "fix_ci_failure", None),
    ]


def test_list_removal_is_aligned_not_shifted(contract: dict[str, Any]) -> None:
    b = {**contract, "allowed_actions": ["edit_source", "skip_test", "revert"]}
    assert diff_contracts(contract, b) == [
        change("allowed_actions[1]", "removed", "retry_ci", None),
        change("allowed_actions[2]", "added", None, "revert"),
    ]


def test_list_items_that_are_dicts_are_compared_inside(contract: dict[str, Any]) -> None:
    b = {**contract, "reward": [{"name": "pass", "weight": 1.0},
                                {"name": "speed", "weight": 0.2, "cap": 1}]}
    assert diff_contracts(contract, b) == [
        change("reward[1].cap", "added", None, 1),
        change("reward[1].weight", "changed", 0.1, 0.2),
    ]


def test_type_changes_are_changes(contract: dict[str, Any]) -> None:
    b = {**contract, "limits": {"max_turns": 8.0},
         "success_criteria": {"all_tests_pass": 1, "coverage_drop_lt": 0.5},
         "observations": {"ci_log": True}}
    kinds = {(c.path, c.kind) for c in diff_contracts(contract, b)}
    assert kinds == {
        ("limits.max_turns", ChangeKind.CHANGED),
        ("success_criteria.all_tests_pass", ChangeKind.CHANGED),
        ("observations", ChangeKind.CHANGED),
    }


def test_odd_keys_are_quoted() -> None:
    changes = diff_contracts({"fixtures": {"a.b": 1}}, {"fixtures": {"a.b": 2, "x y": 3}})
    assert [c.path for c in changes] == ['fixtures["a.b"]', 'fixtures["x y"]']


def test_render_diff_lines(contract: dict[str, Any]) -> None:
    b = {**contract, "limits": {"max_turns": 10}, "task": "fix_ci_v2", "notes": "x" * 300}
    b["allowed_actions"] = ["edit_source", "retry_ci"]
    text = render_diff(diff_contracts(contract, b), max_value_chars=40)
    assert text.splitlines() == [
        "- allowed_actions[2]: \"skip_test\"",
        "~ limits.max_turns: 8 -> 10",
        "+ notes: \"" + "x" * 38 + "…",
        "~ task: \"fix_ci_failure\" -> \"fix_ci_v2\"",
    ]


def test_non_mapping_documents_are_refused() -> None:
    with pytest.raises(ContractDiffError, match="contract B must be a mapping"):
        diff_contracts({}, ["task"])  # type: ignore[arg-type]
