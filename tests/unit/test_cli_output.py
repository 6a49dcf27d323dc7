"""The CLI's output contract for scripts: json, full ids and tabs when piped, plain errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import typer
from typer.testing import CliRunner

from triloop import cli_output
from triloop.cli_output import OutputFormat, field, pick_one, plain_error, print_rows

ROWS = [{"id": "a" * 64, "name": "first run", "status": "running"},
        {"id": "b" * 64, "name": "second\trun", "status": "failed"}]
COLUMNS = (field("id", "id", is_id=True), field("name", "name"), field("status", "status"))


def test_piped_tables_are_tab_separated_with_full_ids_and_no_wrapping(
    capsys: pytest.CaptureFixture[str],
) -> None:
    long = [{**ROWS[0], "name": "x" * 300}]
    print_rows(long + ROWS[1:], COLUMNS, OutputFormat.table)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "id\tname\tstatus"
    assert lines[1] == f"{'a' * 64}\t{'x' * 300}\trunning"  # one line, 300+ columns
    assert lines[2] == f"{'b' * 64}\tsecond run\tfailed"  # a tab in a cell never splits it


def test_a_terminal_sees_short_ids(monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(cli_output, "stdout_is_terminal", lambda: True)
    print_rows(ROWS, COLUMNS, OutputFormat.table)
    shown = capsys.readouterr().out
    assert "a" * cli_output.SHORT_ID_CHARS in shown and "a" * 64 not in shown


def test_json_output_is_the_data_and_nothing_else(capsys: pytest.CaptureFixture[str]) -> None:
    print_rows(ROWS, COLUMNS, OutputFormat.json, json_data={"items": ROWS})
    assert json.loads(capsys.readouterr().out) == {"items": ROWS}


def test_a_prefix_resolves_to_one_id_or_says_why_not(
    capsys: pytest.CaptureFixture[str],
) -> None:
    ids = ["run-abc1", "run-abc2", "run-xyz"]
    assert pick_one("run-x", ids, "training run") == "run-xyz"
    assert pick_one("run-abc1", ids, "training run") == "run-abc1"
    with pytest.raises(typer.Exit) as ambiguous:
        pick_one("run-abc", ids, "training run")
    assert ambiguous.value.exit_code == 1
    assert "'run-abc' is ambiguous" in capsys.readouterr().err
    with pytest.raises(typer.Exit):
        pick_one("nope", ids, "training run")
    assert "no training run has an id starting with 'nope'" in capsys.readouterr().err


def test_errors_are_sentences_without_class_names() -> None:
    assert plain_error(KeyError("no such alias")) == "'no such alias'"
    assert "Error" not in plain_error(RuntimeError())


def test_an_unexpected_error_ends_as_one_plain_line_and_exit_1() -> None:
    # A command raises something no handler expected: main() prints "error: ..." only.
    code = ("import sys; from triloop import cli\n"
            "@cli.app.command('boom')\n"
            "def boom() -> None:\n"
            "    raise ValueError('the thing is broken; fix the thing')\n"
            "sys.argv = ['triloop', 'boom']\n"
            "cli.main()\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 1
    assert done.stderr == "error: the thing is broken; fix the thing\n"


def test_enum_options_name_the_allowed_values() -> None:
    from web.cli_runs import train_app

    result = CliRunner().invoke(train_app, ["list", "--status", "bogus", "--token", "t"])
    assert result.exit_code == 2
    assert "'bogus' is not one of" in result.output and "'completed_with_alarms'" in result.output


def test_dev_status_prints_json_for_scripts() -> None:
    from triloop import cli

    result = CliRunner().invoke(cli.app, ["dev", "status", "--output", "json"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert {s["service"] for s in shown["services"]} >= {"postgres", "opa", "web"}
    assert all(s["state"] for s in shown["services"]) and shown["urls"]
