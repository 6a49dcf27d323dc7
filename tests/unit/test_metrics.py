"""Who may scrape /metrics, and the worker's metrics server that enforces it."""

from __future__ import annotations

import socket
import uuid
from pathlib import Path

import httpx
import pytest
from prometheus_client import REGISTRY
from prometheus_client.core import GaugeMetricFamily

from triloop.config import Settings
from triloop.metrics import (
    MetricsServerError,
    count_stored_episodes,
    decision_outcome,
    is_loopback,
    register_collector,
    render,
    scrape_refusal,
    start_metrics_server,
    watch_episode_queue,
)


@pytest.mark.parametrize("host", ["127.0.0.1", "127.3.4.5", "::1", "::ffff:127.0.0.1",
                                  "localhost"])
def test_loopback_clients(host: str) -> None:
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["10.0.0.8", "192.168.1.2", "::ffff:10.0.0.1", "testclient",
                                  "", None])
def test_other_clients_are_not_loopback(host: str | None) -> None:
    assert not is_loopback(host)


def test_without_a_token_only_loopback_may_scrape() -> None:
    assert scrape_refusal(authorization=None, client_host="127.0.0.1", token=None) is None
    refused = scrape_refusal(authorization="Bearer guess", client_host="10.1.2.3", token=None)
    assert refused is not None and refused.status == 403
    assert "loopback clients only" in refused.reason and "TRILOOP_METRICS_TOKEN" in refused.reason


def test_with_a_token_everyone_must_bear_it_even_on_loopback() -> None:
    token = uuid.uuid4().hex
    assert scrape_refusal(authorization=f"Bearer {token}", client_host="10.1.2.3",
                          token=token) is None
    assert scrape_refusal(authorization=f"bearer {token}", client_host=None, token=token) is None
    for presented in (None, "Bearer wrong", f"Basic {token}", token):
        refused = scrape_refusal(authorization=presented, client_host="127.0.0.1", token=token)
        assert refused is not None and refused.status == 401, presented
        assert "Authorization: Bearer" in refused.reason


def test_decision_outcomes() -> None:
    assert decision_outcome(True, []) == "allow"
    assert decision_outcome(False, ["operators only"]) == "deny"
    assert decision_outcome(False, ["failed closed: OPA at x is unreachable"]) == "failed_closed"


def _sample(name: str, labels: dict[str, str]) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_stored_episodes_count_by_purpose_and_status() -> None:
    purpose = f"probe-{uuid.uuid4().hex[:6]}"
    count_stored_episodes([(purpose, "completed", 4), (purpose, "completed", 2),
                           (purpose, "truncated", 0)])
    assert _sample("triloop_episodes_stored_total",
                   {"purpose": purpose, "status": "completed"}) == 2
    assert _sample("triloop_episodes_stored_total",
                   {"purpose": purpose, "status": "truncated"}) == 1
    assert _sample("triloop_episode_steps_stored_total", {"purpose": purpose}) == 6


class _Fixed:
    def __init__(self, value: float) -> None:
        self.value = value

    def describe(self) -> list[GaugeMetricFamily]:
        return []

    def collect(self) -> list[GaugeMetricFamily]:
        return [GaugeMetricFamily("triloop_unit_probe", "a probe", value=self.value)]


def test_registering_a_collector_again_replaces_it() -> None:
    register_collector("unit-probe", _Fixed(1))  # type: ignore[arg-type]
    register_collector("unit-probe", _Fixed(7))  # type: ignore[arg-type]
    body, content_type = render()
    assert b"triloop_unit_probe 7.0" in body and b"triloop_unit_probe 1.0" not in body
    assert content_type.startswith("text/plain")


def test_the_worker_server_serves_with_the_token_and_refuses_without_it() -> None:
    token = uuid.uuid4().hex
    server = start_metrics_server("127.0.0.1", 0, token=token, setting="TRILOOP_X")
    try:
        good = httpx.get(server.url, headers={"Authorization": f"Bearer {token}"})
        assert good.status_code == 200
        assert "triloop_policy_decision_seconds" in good.text
        assert "triloop_audit_appends_total" in good.text
        bare = httpx.get(server.url)
        assert bare.status_code == 401 and "metrics token" in bare.text
        assert bare.headers["www-authenticate"].startswith("Bearer")
        assert httpx.get(server.url.replace("/metrics", "/other"),
                         headers={"Authorization": f"Bearer {token}"}).status_code == 404
    finally:
        server.close()


def test_the_worker_server_without_a_token_answers_loopback() -> None:
    server = start_metrics_server("127.0.0.1", 0, token=None, setting="TRILOOP_X")
    try:
        assert httpx.get(server.url).status_code == 200
    finally:
        server.close()


def test_a_taken_port_names_the_setting_to_change() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(MetricsServerError, match="TRILOOP_METRICS_PORT_LEARNING"):
            start_metrics_server("127.0.0.1", port, token=None,
                                 setting="TRILOOP_METRICS_PORT_LEARNING")


def test_dev_up_hands_the_metrics_token_to_each_service_that_serves_metrics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from triloop.devstack.stack import ensure_credentials, metrics_line, service_env
    from triloop.secrets import METRICS_TOKEN, ensure_secret

    monkeypatch.delenv("TRILOOP_METRICS_TOKEN", raising=False)
    settings = Settings(home=tmp_path / ".triloop", metrics_port_execution=9471,
                        metrics_port_learning=0, metrics_port_governance=9473)
    ensure_credentials(settings)
    assert "loopback clients only" in metrics_line(settings)
    assert "execution :9471" in metrics_line(settings)
    assert "learning" not in metrics_line(settings)  # port 0: no server
    for service in ("execution", "governance", "web"):
        folder = Path(service_env(settings, service)["TRILOOP_SECRETS_DIR"])  # type: ignore[arg-type]
        assert not (folder / METRICS_TOKEN).exists()
    token = ensure_secret(settings.secrets, METRICS_TOKEN)  # the operator turns the token on
    assert "with the metrics token" in metrics_line(settings)
    for service in ("execution", "learning", "governance", "web"):
        env = service_env(settings, service)  # type: ignore[arg-type]
        served = Settings(home=settings.home, secrets_dir=Path(env["TRILOOP_SECRETS_DIR"]))
        assert served.metrics_scrape_token() == token, service
    verifier = Path(service_env(settings, "verifier")["TRILOOP_SECRETS_DIR"])
    assert not (verifier / METRICS_TOKEN).exists()  # it serves no metrics


def test_the_episode_queue_is_read_at_each_scrape() -> None:
    queue = {"busy": 2, "waiting": 4}
    watch_episode_queue(lambda: queue["busy"], lambda: queue["waiting"])
    assert b"triloop_episodes_waiting 4.0" in render()[0]
    queue.update(busy=0, waiting=0)
    body = render()[0]
    assert b"triloop_episodes_waiting 0.0" in body and b"triloop_episode_slots_busy 0.0" in body
