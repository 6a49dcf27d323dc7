"""The CLI in scripts: --output json, full ids when piped, id prefixes, enum options, and
`train ... --wait` with progress and an exit code that says how the run ended."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from sqlalchemy import Engine, text
from typer.testing import CliRunner

from tests.factories import insert, make_run, uid
from tests.factories_web import Person, add_steps, make_promotion

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.factories_web_fixtures", "tests.integration.cli_app"]


def _run_with_id(engine: Engine, run_id: str, submitted_by: str, status: str) -> str:
    insert(engine, "training_run", id=run_id, submitted_by=submitted_by, config={}, name="t",
           status=status, iterations_done=0)
    return run_id


def _set_status(engine: Engine, run_id: str, status: str, reason: str | None = None) -> None:
    with engine.begin() as conn:
        conn.execute(text("UPDATE training_run SET status = :s, status_reason = :r "
                          "WHERE id = :i"), {"s": status, "r": reason, "i": run_id})


def test_list_and_show_print_json_and_full_ids_when_piped(
    app_cli: typer.Typer, people: dict[str, Person], owner_engine: Engine
) -> None:
    engineer = people["engineer"]
    run_id = make_run(owner_engine, submitted_by=engineer.name)
    token = ["--token", engineer.token]
    listed = CliRunner().invoke(app_cli, ["train", "list", "--submitted-by", engineer.name,
                                          "--output", "json", *token])
    assert listed.exit_code == 0, listed.output
    assert run_id in [r["id"] for r in json.loads(listed.stdout)["items"]]
    piped = CliRunner().invoke(app_cli, ["train", "list", "--submitted-by", engineer.name,
                                         *token])
    header, *rows = piped.stdout.splitlines()
    assert header.split("\t")[:4] == ["id", "name", "submitted by", "status"]
    assert any(row.split("\t")[0] == run_id for row in rows)  # the full id, tab-separated
    shown = CliRunner().invoke(app_cli, ["train", "show", run_id, "-o", "json", *token])
    assert json.loads(shown.stdout)["id"] == run_id

    seeded = make_promotion(owner_engine, submitted_by=engineer.name)
    promotions = CliRunner().invoke(app_cli, ["promotions", "list", "-o", "json", "--token",
                                              people["operator"].token])
    assert seeded.promotion_id in [p["id"] for p in json.loads(promotions.stdout)["items"]]
    one = CliRunner().invoke(app_cli, ["promotions", "show", seeded.promotion_id[:10], "-o",
                                       "json", "--token", people["operator"].token])
    assert one.exit_code == 0, one.output
    assert json.loads(one.stdout)["id"] == seeded.promotion_id


def test_a_unique_prefix_names_a_run_and_an_ambiguous_or_unknown_one_is_refused(
    app_cli: typer.Typer, people: dict[str, Person], owner_engine: Engine
) -> None:
    engineer = people["engineer"]
    stem = uid("pfx").lower()
    for suffix in ("a1", "a2", "b1"):
        _run_with_id(owner_engine, stem + suffix, engineer.name, "running")
    token = ["--token", engineer.token]
    unique = CliRunner().invoke(app_cli, ["train", "show", f"{stem}b", *token])
    assert unique.exit_code == 0 and f"run {stem}b1" in unique.stdout, unique.output
    exact = CliRunner().invoke(app_cli, ["train", "show", f"{stem}a1", *token])
    assert exact.exit_code == 0 and f"run {stem}a1" in exact.stdout, exact.output
    ambiguous = CliRunner().invoke(app_cli, ["train", "show", f"{stem}a", *token])
    assert ambiguous.exit_code == 1
    assert f"'{stem}a' is ambiguous" in ambiguous.stderr and "Error" not in ambiguous.stderr
    unknown = CliRunner().invoke(app_cli, ["train", "pause", f"{stem}zz", *token])
    assert unknown.exit_code == 1
    assert f"no training run has an id starting with '{stem}zz'" in unknown.stderr
    odd = CliRunner().invoke(app_cli, ["train", "show", "a b", *token])
    assert odd.exit_code == 1 and "422" in odd.stderr


def test_status_options_are_validated_by_the_cli_and_the_api(
    app_cli: typer.Typer, people: dict[str, Person]
) -> None:
    token = ["--token", people["operator"].token]
    for group in ("train", "promotions"):
        bogus = CliRunner().invoke(app_cli, [group, "list", "--status", "bogus", *token])
        assert bogus.exit_code == 2 and "'bogus' is not one of" in bogus.output
    grants = CliRunner().invoke(app_cli, ["users", "grants", "--status", "bogus", *token])
    assert grants.exit_code == 2 and "'pending'" in grants.output


def test_wait_follows_a_run_and_exits_by_how_it_ended(
    app_cli: typer.Typer, people: dict[str, Person], owner_engine: Engine
) -> None:
    engineer = people["engineer"]
    token = ["--token", engineer.token]
    fast = ["--poll-interval", "0.05"]
    failed = make_run(owner_engine, submitted_by=engineer.name)
    add_steps(owner_engine, failed, 2)
    _set_status(owner_engine, failed, "failed", "the update diverged")
    result = CliRunner().invoke(app_cli, ["train", "show", failed, "--wait", *fast, *token])
    assert result.exit_code == 1
    assert f"run {failed}: iteration 1: reward_mean=" in result.stderr
    assert f"run {failed} failed: the update diverged" in result.stderr

    done = make_run(owner_engine, submitted_by=engineer.name)
    _set_status(owner_engine, done, "completed")
    ok = CliRunner().invoke(app_cli, ["train", "show", done, "--wait", *fast, *token])
    assert ok.exit_code == 0 and f"run {done} (t)" in ok.stdout

    paused = make_run(owner_engine, submitted_by=engineer.name)
    _set_status(owner_engine, paused, "paused", "echo_trap alarm")
    waits = CliRunner().invoke(app_cli, ["train", "show", paused, "--wait", *fast, *token])
    assert waits.exit_code == 3 and f"triloop train resume {paused}" in waits.stderr

    running = make_run(owner_engine, submitted_by=engineer.name)
    _set_status(owner_engine, running, "running")
    late = CliRunner().invoke(app_cli, ["train", "show", running, "--wait", "--timeout", "0.2",
                                        *fast, *token])
    assert late.exit_code == 4 and "still running after 0.2 s" in late.stderr


def test_logs_print_one_line_per_iteration(
    app_cli: typer.Typer, people: dict[str, Person], owner_engine: Engine
) -> None:
    engineer = people["engineer"]
    run_id = make_run(owner_engine, submitted_by=engineer.name)
    add_steps(owner_engine, run_id, 3, alarm_at=2)
    logs = CliRunner().invoke(app_cli, ["train", "logs", run_id, "--token", engineer.token])
    assert logs.exit_code == 0, logs.output
    lines = logs.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == [f"iteration {i}" for i in range(3)]
    assert lines[2].endswith("ALARM echo_trap")
    as_json = CliRunner().invoke(app_cli, ["train", "logs", run_id, "-o", "json", "--token",
                                           engineer.token])
    assert [json.loads(line)["iteration"] for line in as_json.stdout.splitlines()] == [0, 1, 2]
    unknown = CliRunner().invoke(app_cli, ["train", "logs", run_id + "x", "--token",
                                           engineer.token])
    assert unknown.exit_code == 1 and "no training run has an id starting" in unknown.stderr


def test_audit_events_and_export_for_an_auditor(
    app_cli: typer.Typer, people: dict[str, Person], tmp_path: Path
) -> None:
    auditor = ["--token", people["auditor"].token]
    # An engineer's refused read of the audit log is a decision: it is in the chain.
    CliRunner().invoke(app_cli, ["audit", "events", "--token", people["engineer"].token])
    events = CliRunner().invoke(app_cli, ["audit", "events", "--decision", "deny", "--actor",
                                          people["engineer"].name, "-o", "json", *auditor])
    assert events.exit_code == 0, events.output
    assert json.loads(events.stdout)["items"][0]["resource"]["kind"] == "audit_event"
    out = tmp_path / "audit.csv"
    exported = CliRunner().invoke(app_cli, ["audit", "export", "--decision", "deny",
                                            "--out", str(out), *auditor])
    assert exported.exit_code == 0, exported.output
    assert out.read_text().splitlines()[0].startswith("seq,at,actor_user")
    refused = CliRunner().invoke(app_cli, ["audit", "export", "--token",
                                           people["engineer"].token])
    assert refused.exit_code == 1 and "403" in refused.stderr
    bogus = CliRunner().invoke(app_cli, ["audit", "events", "--decision", "maybe", *auditor])
    assert bogus.exit_code == 2 and "'maybe' is not one of" in bogus.output
