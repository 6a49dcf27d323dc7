"""Prometheus /metrics on every service, against the real PostgreSQL, Temporal and OPA.

The web service's /metrics (token, or loopback only), a loop worker's metrics server as
``serve`` runs it (with the backlog of the queues it polls), the governance worker's gate
states read from the database, and the execution store's rollout throughput.
"""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine
from temporalio import workflow
from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from execution_loop.store import write_trajectories
from governance_loop.gate_metrics import GateStates
from tests.factories import make_task
from tests.factories_web import Person, add_gate, make_promotion
from tests.integration.test_trajectories import episode, planned
from tests.temporal_helpers import loop_client
from triloop.config import Settings
from triloop.devstack.processes import free_port, port_in_use
from triloop.metrics import render
from triloop.wiring import build_authorizer
from triloop.worker_serve import serve

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.factories_web_fixtures"]


def _samples(body: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of a scrape, by name and labels."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(body) for s in family.samples}


def _value(body: str, name: str, **labels: str) -> float:
    return _samples(body).get((name, frozenset(labels.items())), 0.0)


@pytest.fixture(scope="module")
def metrics_token() -> str:
    return uuid.uuid4().hex


@pytest.fixture(scope="module")
def guarded_app(web_settings: Settings, metrics_token: str) -> FastAPI:
    """The web app with a metrics token configured."""
    from web.app import create_app

    return create_app(web_settings.model_copy(update={"metrics_token": metrics_token}),
                      temporal_timeout_s=15.0)


def test_web_metrics_need_the_token_and_count_policy_decisions_and_audit_appends(
    guarded_app: FastAPI, metrics_token: str, people: dict[str, Person]
) -> None:
    client = TestClient(guarded_app)
    bearer = {"Authorization": f"Bearer {metrics_token}"}
    before = client.get("/metrics", headers=bearer)
    assert before.status_code == 200, before.text
    assert before.headers["content-type"].startswith("text/plain")
    # A person's call: the policy decides it (read: the access log), the denial is audited.
    engineer = {"Authorization": f"Bearer {people['engineer'].token}"}
    assert client.get("/api/runs", headers=engineer).status_code == 200
    refused = client.get("/api/users", headers=engineer)
    assert refused.status_code == 403
    after = client.get("/metrics", headers=bearer).text
    decided = {"service": "web", "action": "read"}
    assert (_value(after, "triloop_policy_decision_seconds_count", **decided, outcome="allow")
            > _value(before.text, "triloop_policy_decision_seconds_count", **decided,
                     outcome="allow"))
    assert (_value(after, "triloop_audit_appends_total", log="access", decision="allow")
            > _value(before.text, "triloop_audit_appends_total", log="access", decision="allow"))
    denied_before = _value(before.text, "triloop_audit_appends_total", log="chain",
                           decision="deny")
    assert _value(after, "triloop_audit_appends_total", log="chain",
                  decision="deny") > denied_before

    for headers in ({}, {"Authorization": "Bearer wrong"}, engineer):
        answer = client.get("/metrics", headers=headers)
        assert answer.status_code == 401, headers
        assert answer.headers["content-type"].startswith("application/problem+json")
        assert "metrics token" in answer.json()["detail"]
        assert "triloop_" not in answer.text


async def test_web_metrics_without_a_token_answer_loopback_only(web_app: FastAPI) -> None:
    remote = TestClient(web_app).get("/metrics")  # the test client is no loopback address
    assert remote.status_code == 403
    assert "loopback clients only" in remote.json()["detail"]
    loopback = httpx.ASGITransport(app=web_app, client=("127.0.0.1", 50123))
    async with httpx.AsyncClient(transport=loopback, base_url="http://testserver") as client:
        answer = await client.get("/metrics")
    assert answer.status_code == 200
    assert "triloop_policy_decision_seconds" in answer.text
    assert "/metrics" not in TestClient(web_app).get("/openapi.json").json()["paths"]


@workflow.defn(name="MetricsProbe")
class MetricsProbe:
    """Answers at once: proof that the served worker polls."""

    @workflow.run
    async def run(self, name: str) -> str:
        """Say who was served."""
        return f"served {name}"


async def test_a_served_worker_has_metrics_with_its_queue_backlog(settings: Settings) -> None:
    port = free_port()
    token = uuid.uuid4().hex
    served = settings.model_copy(update={"metrics_port_governance": port,
                                         "metrics_token": token})
    queue = settings.task_queue(f"metrics-{uuid.uuid4().hex[:8]}")

    def build(client: Client) -> list[Worker]:
        return [Worker(client, task_queue=queue, workflows=[MetricsProbe],
                       workflow_runner=UnsandboxedWorkflowRunner())]

    serving = asyncio.create_task(serve(served, "governance", build))
    client = await loop_client(settings, "governance", "metrics-test")
    answer = await asyncio.wait_for(client.execute_workflow(
        MetricsProbe.run, "probe", id=f"metrics-{uuid.uuid4().hex[:8]}", task_queue=queue), 120)
    assert answer == "served probe"
    url = f"http://127.0.0.1:{port}/metrics"
    async with httpx.AsyncClient() as http:
        backlog: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        for _ in range(100):  # the sampler asks the server as the worker starts
            scrape = await http.get(url, headers={"Authorization": f"Bearer {token}"})
            assert scrape.status_code == 200
            backlog = {k: v for k, v in _samples(scrape.text).items()
                       if k[0] == "triloop_task_queue_backlog" and ("task_queue", queue) in k[1]}
            if len(backlog) == 3:
                break
            await asyncio.sleep(0.2)
        assert {dict(k[1])["type"] for k in backlog} == {"workflow", "activity", "nexus"}
        assert all(dict(k[1])["namespace"] == settings.temporal_namespace("governance")
                   for k in backlog)
        assert (await http.get(url)).status_code == 401
    os.kill(os.getpid(), signal.SIGTERM)  # serve's handler takes it: the process lives on
    await asyncio.wait_for(serving, 60)
    assert not port_in_use(port)  # the metrics server went with the workers


def _collected(collector: GateStates) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in collector.collect() for s in family.samples}


def test_gate_states_are_read_from_the_database(
    role_engine: Callable[[str], Engine], owner_engine: Engine
) -> None:
    states = GateStates(role_engine("governance"))
    gate = f"probe-{uuid.uuid4().hex[:6]}"  # a gate name no other test uses
    before = _collected(states)
    seeded = make_promotion(owner_engine, submitted_by="metrics-eng", current_gate=gate)
    add_gate(owner_engine, seeded.promotion_id, gate, passed=False,
             evidence={"verdict": "fail"})
    after = _collected(states)
    assert after[("triloop_gate_states_up", frozenset())] == 1
    assert after[("triloop_promotions_open", frozenset({("gate", gate)}))] == 1
    assert after[("triloop_gate_results", frozenset({("gate", gate), ("verdict", "fail")}))] == 1
    open_key = ("triloop_promotions", frozenset({("status", "open")}))
    assert after[open_key] >= before.get(open_key, 0) + 1


def test_gate_states_say_when_the_database_did_not_answer(settings: Settings) -> None:
    from triloop.db import engine_for_url

    unreachable = engine_for_url("postgresql+psycopg://nobody:x@127.0.0.1:9/none")
    assert _collected(GateStates(unreachable)) == {("triloop_gate_states_up", frozenset()): 0}


def _stored(purpose: str, status: str) -> float:
    return REGISTRY.get_sample_value("triloop_episodes_stored_total",
                                     {"purpose": purpose, "status": status}) or 0.0


def test_stored_episodes_are_the_rollout_throughput(
    role_engine: Callable[[str], Engine], owner_engine: Engine, settings: Settings
) -> None:
    engine = role_engine("execution")
    authorizer = build_authorizer(settings, "execution")
    task = make_task(owner_engine)
    batch = f"batch-metrics-{uuid.uuid4().hex[:8]}"
    rows: list[Any] = [episode(task, batch_id=batch, steps=n) for n in (2, 3)]
    planned(owner_engine, *(row for row, _ in rows))
    episodes_before = _stored("training", "completed")
    steps_before = REGISTRY.get_sample_value("triloop_episode_steps_stored_total",
                                             {"purpose": "training"}) or 0.0
    written = write_trajectories(engine=engine, authorizer=authorizer, episodes=rows)
    assert len(written.written) == 2
    again = write_trajectories(engine=engine, authorizer=authorizer, episodes=rows)
    assert not again.written  # stored already: not counted twice
    assert _stored("training", "completed") == episodes_before + 2
    assert REGISTRY.get_sample_value("triloop_episode_steps_stored_total",
                                     {"purpose": "training"}) == steps_before + 5


async def test_each_loop_worker_wires_its_own_families(settings: Settings) -> None:
    from execution_loop.worker import build_worker as build_execution
    from governance_loop.worker import build_worker as build_governance

    governance = await loop_client(settings, "governance", "metrics-wiring")
    build_governance(governance, settings)
    execution = await loop_client(settings, "execution", "metrics-wiring")
    build_execution(execution, settings)
    body = render()[0].decode()
    assert _value(body, "triloop_gate_states_up") == 1  # governance reads gate states
    assert "triloop_promotions_open" in body and "triloop_gate_results" in body
    assert _value(body, "triloop_episode_slots_busy") == 0  # execution's own queue
    assert "triloop_episodes_waiting 0.0" in body


async def test_a_refused_backlog_sample_drops_its_series(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    from triloop.metrics import TASK_QUEUE_BACKLOG
    from triloop.worker_serve import sample_backlogs

    # Governance's token in the execution namespace: the server refuses every describe.
    client = await loop_client(settings, "execution", "metrics-refused", service="governance")
    queue = f"nobody-{uuid.uuid4().hex[:8]}"
    labels = {"namespace": client.namespace, "task_queue": queue, "type": "workflow"}
    TASK_QUEUE_BACKLOG.labels(**labels).set(7)  # as if an earlier sample had answered
    sampling = asyncio.create_task(sample_backlogs(client, [queue], every_s=3600))
    try:
        for _ in range(100):
            if REGISTRY.get_sample_value("triloop_task_queue_backlog", labels) is None:
                break
            await asyncio.sleep(0.1)
        assert REGISTRY.get_sample_value("triloop_task_queue_backlog", labels) is None
        assert not sampling.done()  # refused, logged, and it goes on
    finally:
        sampling.cancel()
    assert f"backlog of {queue} (workflow) not sampled" in caplog.text
