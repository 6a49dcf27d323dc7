"""Environment contracts: every kind of problem reported with its path, identity, fixtures."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from execution_loop.cli import env_app
from execution_loop.environments import registry
from triloop.contracts import (
    ContractError,
    canonical_form,
    contract_id,
    fixture_hashes,
    load_contract,
    parse_contract_text,
    parse_percentage,
    validate_contract_text,
)

GOOD = """\
task: fix_ci_failure
initial_state:
  repository: immutable_commit
  repository_fixture: repo
  commits: repo@abc
observations: [ci_log, test_report, command_exit_code]
allowed_actions: [edit_source, retry_ci, skip_test]
success_criteria: {all_tests_pass: true, no_new_failures: true, coverage_drop_lt: 0.5%}
reward:
  outcome: {success: 1.0, failure: 0.0}
limits: {max_turns: 8, wall_time_s: 60, max_tokens_per_turn: 256, max_total_tokens: 2048}
context: {keep_last_turns: 3}
fixtures: [repo]
"""


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "main.py").write_text("print('hi')\n")
    return tmp_path


def problems_of(text: str, folder: Path) -> dict[str, str]:
    found = validate_contract_text(text, base_dir=folder, capabilities=registry.capabilities())
    return {p.path: p.message for p in found}


def test_a_good_contract_has_no_problems(folder: Path) -> None:
    assert validate_contract_text(GOOD, base_dir=folder, capabilities=registry.capabilities()) == []
    contract = parse_contract_text(GOOD, base_dir=folder)
    assert contract.success_criteria.coverage_drop_lt == pytest.approx(0.005)
    assert contract.limits.max_turns == 8
    assert contract.source_dir == folder.resolve()


@pytest.mark.parametrize("name", registry.list_environments())
def test_builtin_contracts_are_valid(name: str) -> None:
    path = registry.builtin_contract_path(name)
    text = path.read_text()
    caps = registry.capabilities()
    assert validate_contract_text(text, base_dir=path.parent, capabilities=caps) == []
    assert load_contract(path).task == name


@pytest.mark.parametrize(
    ("text", "value"), [("0.5%", 0.005), ("12 %", 0.12), (" 100% ", 1.0), ("0%", 0.0)]
)
def test_percentages_parse_into_fractions(text: str, value: float) -> None:
    assert parse_percentage(text) == pytest.approx(value)


@pytest.mark.parametrize("bad", [0.5, "0.5", "half", "-1%", "101%", "%", True])
def test_bad_percentages_say_what_is_expected(bad: object) -> None:
    with pytest.raises(ValueError, match="percentage"):
        parse_percentage(bad)


def test_yaml_syntax_error_has_a_line_number(folder: Path) -> None:
    text = GOOD.replace("context: {keep_last_turns: 3}", "context: {keep_last_turns: 3")
    [problem] = validate_contract_text(text, base_dir=folder)
    assert "YAML syntax error" in problem.message
    assert problem.line is not None and problem.line >= 11


def test_missing_field(folder: Path) -> None:
    text = GOOD.replace("reward:\n  outcome: {success: 1.0, failure: 0.0}\n", "")
    assert problems_of(text, folder) == {"reward": "required field is missing"}


def test_wrong_type(folder: Path) -> None:
    text = GOOD.replace("max_turns: 8", "max_turns: eight")
    assert problems_of(text, folder) == {"limits.max_turns": "expected an integer, got 'eight'"}


def test_bad_percentage_is_reported_with_its_path(folder: Path) -> None:
    text = GOOD.replace("coverage_drop_lt: 0.5%", "coverage_drop_lt: 0.5")
    found = problems_of(text, folder)
    assert found == {
        "success_criteria.coverage_drop_lt": "expected a percentage like '0.5%', got 0.5"
    }


def test_unknown_key_lists_the_allowed_ones(folder: Path) -> None:
    text = GOOD.replace("context: {keep_last_turns: 3}", "context: {keep_last: 3}")
    message = problems_of(text, folder)["context.keep_last"]
    assert message.startswith("unknown key") and "keep_last_turns" in message


def test_missing_fixture(folder: Path) -> None:
    shutil.rmtree(folder / "repo")
    assert problems_of(GOOD, folder)["fixtures[0]"].startswith("fixture not found: repo")


def test_fixture_paths_stay_inside_the_contract_folder(folder: Path) -> None:
    text = GOOD.replace("fixtures: [repo]", "fixtures: [repo, ../elsewhere, /etc]")
    found = problems_of(text, folder)
    assert "inside the contract's folder" in found["fixtures[1]"]
    assert "inside the contract's folder" in found["fixtures[2]"]


def test_duplicate_keys_are_not_silently_dropped(folder: Path) -> None:
    text = GOOD + "context: {keep_last_turns: 1}\n"
    [problem] = validate_contract_text(text, base_dir=folder)
    assert problem.path == "context" and "duplicate key" in problem.message
    assert problem.line == GOOD.count("\n") + 1


def test_contract_checked_against_its_environment(folder: Path) -> None:
    text = GOOD.replace("skip_test]", "skip_test, fly]").replace(
        "all_tests_pass: true,", "all_tests_pass: true, goal_reached: true,"
    )
    found = problems_of(text, folder)
    assert "no action 'fly'" in found["allowed_actions[3]"]
    assert "no success criterion 'goal_reached'" in found["success_criteria.goal_reached"]
    unknown = problems_of(GOOD.replace("task: fix_ci_failure", "task: chess"), folder)
    assert unknown["task"].startswith("unknown environment 'chess'")


def test_every_problem_is_reported_at_once(folder: Path) -> None:
    text = (
        GOOD.replace("max_turns: 8", "max_turns: 0")
        .replace("wall_time_s: 60", "wall_time_s: soon")
        .replace("coverage_drop_lt: 0.5%", "coverage_drop_lt: lots")
        .replace("observations:", "colour: blue\nobservations:")
        .replace("fixtures: [repo]", "fixtures: [nowhere]")
    )
    found = problems_of(text, folder)
    assert set(found) == {
        "limits.max_turns",
        "limits.wall_time_s",
        "success_criteria.coverage_drop_lt",
        "colour",
        "fixtures[0]",
        "initial_state.repository_fixture",  # names repo, which is no longer listed
    }
    lines = [p.line or 0 for p in validate_contract_text(text, base_dir=folder)]
    assert lines == sorted(lines)  # document order


@pytest.mark.parametrize("text", ["", "- a\n- b\n", "just a string\n"])
def test_a_document_that_is_not_a_mapping(text: str, folder: Path) -> None:
    [problem] = validate_contract_text(text, base_dir=folder)
    assert problem.path == "" and ("empty" in problem.message or "mapping" in problem.message)


def test_load_contract_raises_with_every_problem(folder: Path) -> None:
    path = folder / "bad.yaml"
    path.write_text(GOOD.replace("max_turns: 8", "max_turns: x").replace("[repo]", "[gone]"))
    with pytest.raises(ContractError) as caught:
        load_contract(path)
    assert {p.path for p in caught.value.problems} == {
        "limits.max_turns", "fixtures[0]", "initial_state.repository_fixture"}
    assert "limits.max_turns: expected an integer" in str(caught.value)


def test_identity_ignores_key_order_whitespace_and_spelling(folder: Path) -> None:
    first = parse_contract_text(GOOD, base_dir=folder)
    data = yaml.safe_load(GOOD)
    shuffled = {k: data[k] for k in reversed(list(data))}
    shuffled["success_criteria"]["coverage_drop_lt"] = "0.50 %"
    text = "# same contract\n" + yaml.safe_dump(shuffled, sort_keys=False, indent=4)
    second = parse_contract_text(text, base_dir=folder)
    assert contract_id(first) == contract_id(second)
    assert len(contract_id(first)) == 64


def test_canonical_form_is_sorted_compact_json_that_round_trips(folder: Path) -> None:
    contract = parse_contract_text(GOOD, base_dir=folder)
    blob = canonical_form(contract, fixture_hashes(contract))
    document = json.loads(blob)
    assert blob == json.dumps(document, sort_keys=True, separators=(",", ":")).encode()
    assert document["contract"]["success_criteria"]["coverage_drop_lt"] == "0.5%"
    again = parse_contract_text(yaml.safe_dump(document["contract"]), base_dir=folder)
    assert contract_id(again) == contract_id(contract)


def test_content_change_gives_a_new_id(folder: Path) -> None:
    first = parse_contract_text(GOOD, base_dir=folder)
    second = parse_contract_text(GOOD.replace("max_turns: 8", "max_turns: 9"), base_dir=folder)
    assert contract_id(first) != contract_id(second)


def test_fixture_change_gives_a_new_id(folder: Path) -> None:
    contract = parse_contract_text(GOOD, base_dir=folder)
    before = contract_id(contract)
    (folder / "repo" / "__pycache__").mkdir()
    (folder / "repo" / "__pycache__" / "main.cpython-311.pyc").write_bytes(b"cache")
    assert contract_id(contract) == before  # caches are not content
    assert list(fixture_hashes(contract)) == ["repo/main.py"]
    (folder / "repo" / "main.py").write_text("print('bye')\n")
    assert contract_id(contract) != before
    (folder / "repo" / "main.py").write_text("print('hi')\n")
    (folder / "repo" / "extra.txt").write_text("new file\n")
    assert contract_id(contract) != before


def test_cli_validate_prints_every_problem_and_exits_1(folder: Path) -> None:
    path = folder / "contract.yaml"
    path.write_text(GOOD.replace("max_turns: 8", "max_turns: x").replace("[repo]", "[gone]"))
    result = CliRunner().invoke(env_app, ["validate", str(path)])
    assert result.exit_code == 1
    assert "limits.max_turns: expected an integer, got 'x'" in result.output
    assert "fixtures[0]: fixture not found" in result.output


def test_cli_validate_prints_the_id_of_a_valid_contract(folder: Path) -> None:
    path = folder / "contract.yaml"
    path.write_text(GOOD)
    result = CliRunner().invoke(env_app, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == contract_id(load_contract(path))


def test_a_single_file_fixture_is_hashed_under_its_own_path(folder: Path) -> None:
    (folder / "data.json").write_text("{}\n")
    text = GOOD.replace("fixtures: [repo]", "fixtures: [repo, ./data.json]")
    contract = parse_contract_text(text, base_dir=folder)
    assert contract.fixtures == ["repo", "data.json"]  # normalised
    assert sorted(fixture_hashes(contract)) == ["data.json", "repo/main.py"]


def test_cli_lists_the_builtin_environments() -> None:
    result = CliRunner().invoke(env_app, ["list"])
    assert result.exit_code == 0
    # Piped: a header line, then one tab-separated line per environment with its full id.
    assert [line.split("\t")[0] for line in result.output.splitlines()] == [
        "name",
        "fix_ci_failure",
        "frozen_lake",
        "gymnasium_text",
        "openenv",
        "reasoning_gym",
        "tool_arithmetic",
        "verifiers",
    ]


def test_a_fixture_state_value_may_not_leave_the_folder(folder: Path) -> None:
    text = GOOD.replace("repository_fixture: repo", "repository_fixture: ../../../../etc")
    found = problems_of(text, folder)
    assert set(found) == {"initial_state.repository_fixture"}
    assert "leaves the contract's folder" in found["initial_state.repository_fixture"]
    unlisted = problems_of(GOOD.replace("repository_fixture: repo", "repository_fixture: src"),
                           folder)
    assert "not one of the fixtures listed" in unlisted["initial_state.repository_fixture"]


def test_symbolic_links_in_fixtures_are_refused(folder: Path, tmp_path_factory: Any) -> None:
    outside = tmp_path_factory.mktemp("outside")
    (outside / "secret.txt").write_text("not yours\n")
    (folder / "repo" / "leak.txt").symlink_to(outside / "secret.txt")
    inside = problems_of(GOOD, folder)
    assert set(inside) == {"fixtures[0]"} and "holds a symbolic link" in inside["fixtures[0]"]
    assert "repo/leak.txt" in inside["fixtures[0]"]
    (folder / "repo" / "leak.txt").unlink()
    (folder / "linked").symlink_to(outside, target_is_directory=True)
    text = GOOD.replace("fixtures: [repo]", "fixtures: [repo, linked]")
    linked = problems_of(text, folder)
    assert set(linked) == {"fixtures[1]"} and "symbolic link" in linked["fixtures[1]"]
    assert validate_contract_text(GOOD, base_dir=folder, capabilities=registry.capabilities()) == []


def test_cli_validate_refuses_an_escaping_fixture_and_a_symlink(folder: Path) -> None:
    path = folder / "contract.yaml"
    path.write_text(GOOD.replace("repository_fixture: repo", "repository_fixture: ../../../../etc"))
    result = CliRunner().invoke(env_app, ["validate", str(path)])
    assert result.exit_code == 1
    assert "initial_state.repository_fixture: '../../../../etc' leaves the contract's folder" in (
        result.output)
    path.write_text(GOOD)
    (folder / "repo" / "passwd").symlink_to("/etc/passwd")
    result = CliRunner().invoke(env_app, ["validate", str(path)])
    assert result.exit_code == 1 and "holds a symbolic link, repo/passwd -> /etc/passwd" in (
        result.output)


def test_frozen_lake_takes_a_layout_name_and_nothing_else(folder: Path) -> None:
    shipped = registry.builtin_contract_path("frozen_lake").read_text(encoding="utf-8")
    corners = shipped.replace("  holes: 3\n", "  holes: 3\n  layout: corners\n")
    assert "layout: corners" in corners and problems_of(corners, folder) == {}
    found = problems_of(shipped.replace("  holes: 3\n", "  holes: 3\n  layout: 2\n"), folder)
    assert found == {"initial_state.layout": "expected str, got 2"}
