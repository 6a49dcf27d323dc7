"""An OpenEnv server (openenv-core's own create_fastapi_app) behind triloop's ``openenv``
adapter: its session protocol, the pin on its schema, a verdict from the verifier process."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from execution_loop.admission_probe import RecordingSandbox
from execution_loop.environments import openenv as openenv_env
from execution_loop.environments import registry
from execution_loop.environments.service_verifier import ServiceVerdictError
from tests.environment_services import free_port, openenv_server, write_openenv_contract
from triloop.contracts import load_contract

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    with openenv_server() as url:
        yield url


def test_openenv_http_steps_are_stateless_so_episodes_use_the_session(server_url: str) -> None:
    """Why the adapter speaks /ws: OpenEnv's HTTP /step runs on a fresh instance."""
    reset = httpx.post(f"{server_url}/reset", json={"seed": 1}).json()
    step = httpx.post(f"{server_url}/step", json={"action": {"message": "down"}}).json()
    assert reset["observation"]["left"] == 4
    assert step["observation"]["left"] == -1  # a new instance's 0, less one: the reset is lost


def test_an_openenv_episode_plays_and_is_verified_outside_the_worker(
    server_url: str, tmp_path: Path
) -> None:
    contract = load_contract(write_openenv_contract(tmp_path, server_url),
                             capabilities=registry.capabilities())
    sandbox = RecordingSandbox()
    env = registry.make_environment(contract, sandbox=sandbox)
    assert isinstance(env, openenv_env.OpenEnv)
    first = env.reset(1)
    assert first == "4 left: write down"
    fingerprint = env.state_fingerprint()
    assert env.reset(1) == first and env.state_fingerprint() == fingerprint
    refused = env.step("")  # the server's Action needs one character at least
    assert refused.reward == -0.1 and not refused.feedback["valid_action"]
    for action in registry.reference_solution("openenv", 1, contract):
        result = env.step(action)
        if result.done:
            break
    assert result.done and result.observation == "done"
    outcome = env.outcome()
    assert outcome.success and outcome.reward == 1.0, outcome.details
    assert outcome.details["invalid_actions"] == 1
    assert sandbox.verifier_references == ["execution_loop.environments.openenv:verify"]
    env.reset(2)  # five to count; two downs do not get there
    env.step("down")
    env.step("Down!")
    short = env.outcome()
    assert not short.success and short.details["reason"] == "not_finished"
    env.close()


def test_a_server_that_is_not_the_pinned_one_is_refused(server_url: str, tmp_path: Path) -> None:
    other = load_contract(write_openenv_contract(tmp_path, server_url, digest="1" * 64))
    with pytest.raises(openenv_env.OpenEnvProtocolError, match="the contract pins 1111"):
        registry.make_environment(other)
    path = write_openenv_contract(tmp_path, server_url)
    path.write_text(path.read_text().replace("action_field: message", "action_field: code"))
    with pytest.raises(openenv_env.OpenEnvProtocolError, match="no field 'code'"):
        registry.make_environment(load_contract(path))
    gone = load_contract(write_openenv_contract(tmp_path, f"http://127.0.0.1:{free_port()}",
                                                digest="2" * 64))
    with pytest.raises(openenv_env.OpenEnvUnavailable):
        registry.make_environment(gone)


def test_the_verifier_refuses_a_server_that_changed(server_url: str, tmp_path: Path) -> None:
    contract = load_contract(write_openenv_contract(tmp_path, server_url))
    env = registry.make_environment(contract)
    assert isinstance(env, openenv_env.OpenEnv)
    env.reset(0)
    env.step("down")
    payload = env.verifier_request().payload
    moved = {**payload, "server": {**payload["server"], "schema_digest": "3" * 64}}
    with pytest.raises(ServiceVerdictError, match="the contract pins 3333"):
        openenv_env.verify(moved)
    env.close()
    assert json.dumps(payload)  # what the verifier gets travels as JSON


def test_a_server_with_no_room_is_unavailable_not_wrong(server_url: str, tmp_path: Path) -> None:
    """OpenEnv refuses a session past its max_concurrent_envs: infrastructure, retried."""
    server = openenv_env.Server.of(
        load_contract(write_openenv_contract(tmp_path, server_url)).initial_state)
    held = [openenv_env.Session(server) for _ in range(64)]  # the example's capacity
    try:
        for session in held:
            session.reset(0)
        with pytest.raises(openenv_env.OpenEnvUnavailable, match="no room for another session"):
            openenv_env.Session(server).reset(0)
    finally:
        for session in held:
            session.close()
    again = openenv_env.Session(server)
    assert again.reset(0)["observation"]["left"] == 3  # room once the others closed
    again.close()
