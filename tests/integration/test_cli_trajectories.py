"""``triloop trajectories list|show`` through the API with the person's token."""

from __future__ import annotations

import json

import pytest
import typer
from sqlalchemy import Engine
from typer.testing import CliRunner

from tests.factories_transcripts import promotion_with_episodes
from tests.factories_web import Person

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.factories_web_fixtures", "tests.integration.cli_app"]


def test_list_and_show_print_what_the_api_allows(
    app_cli: typer.Typer, people: dict[str, Person], owner_engine: Engine,
) -> None:
    made = promotion_with_episodes(owner_engine, submitted_by=people["engineer"].name)
    runner = CliRunner()
    auditor = ["--token", people["auditor"].token]
    listed = runner.invoke(app_cli, ["trajectories", "list", "--promotion",  # by a prefix
                                     made.seeded.promotion_id[:12], "--purpose", "shadow",
                                     *auditor])
    assert listed.exit_code == 0, listed.output
    lines = listed.stdout.strip().splitlines()
    assert lines[0].split("\t")[:2] == ["id", "purpose"]
    assert [line.split("\t")[0] for line in lines[1:]] == made.shadow
    episode = made.candidate[made.tasks[0]][0]
    shown = runner.invoke(app_cli, ["trajectories", "show", episode[:-1], "--turns", "1",
                                    *auditor])
    assert shown.exit_code == 0, shown.output
    assert f"episode {episode}: eval on task {made.tasks[0]}" in shown.stdout
    assert "verdict: success True" in shown.stdout and "bubblewrap" in shown.stdout
    assert "action: move right (0)" in shown.stdout and "4 (2 trained" in shown.stdout
    assert "more turns: triloop trajectories show" in shown.stderr
    as_json = runner.invoke(app_cli, ["trajectories", "show", episode, "-o", "json", *auditor])
    assert json.loads(as_json.stdout)["turns"]["num_steps"] == 2
    refused = runner.invoke(app_cli, ["trajectories", "show", episode,
                                      "--token", people["engineer"].token])
    assert refused.exit_code == 1
    assert "auditors and operators only" in refused.stderr
    training = runner.invoke(app_cli, ["trajectories", "list", "--run", made.seeded.run_id[:11],
                                       "--iteration", "3", "--token",
                                       people["engineer"].token, "-o", "json"])
    assert training.exit_code == 0, training.output
    assert sorted(e["id"] for e in json.loads(training.stdout)["items"]) == sorted(made.training)
