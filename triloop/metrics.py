"""Prometheus metrics of every triloop service, and who may scrape them.

Each process (the web service and each loop's worker) keeps its metrics in
prometheus-client's process-wide registry. The web service serves them at ``GET /metrics``
on its own port; each worker serves them from a small HTTP server of its own
(``start_metrics_server``, port ``metrics_port_<loop>``, bound to ``metrics_host``).

The families, and where they are counted:

- ``triloop_policy_decision_seconds``: one OPA decision, round trip (``OpaClient.decide``),
  by service, action and outcome (allow, deny, or failed_closed when OPA could not answer);
- ``triloop_audit_appends_total``: rows appended to the audit chain (by decision) and to
  the access log (``log="access"``) (``triloop.audit``), counted as each append returns in
  its caller's transaction (one rolled back later still counts);
- ``triloop_episodes_stored_total`` and ``triloop_episode_steps_stored_total``: rollout
  throughput, the episodes (and their steps) the execution worker stored, by purpose and
  status;
- ``triloop_episode_slots_busy`` and ``triloop_episodes_waiting``: the execution worker's
  own queue, episodes playing and episodes waiting for a slot;
- ``triloop_task_queue_backlog``: the Temporal task queues each worker polls, as the
  server reports them (sampled by ``triloop.worker_serve``);
- ``triloop_promotions_open`` and ``triloop_gate_results``: gate states, read from the
  database at each scrape by the governance worker (``governance_loop.gate_metrics``).

Who may scrape (``scrape_refusal``, the one rule for every endpoint): with a metrics token
configured (``TRILOOP_METRICS_TOKEN`` or the ``metrics-token`` secret), only a request
bearing it (``Authorization: Bearer <token>``, Prometheus' ``authorization`` setting);
without one, only a client on the loopback interface.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import socketserver
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    make_wsgi_app,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

log = logging.getLogger("triloop.metrics")

# Loopback OPA answers in about a millisecond; a slow decision is tens to hundreds.
_DECISION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

POLICY_DECISION_SECONDS = Histogram(
    "triloop_policy_decision_seconds",
    "Time of one policy decision asked of OPA, round trip (seconds).",
    ["service", "action", "outcome"], buckets=_DECISION_BUCKETS)
AUDIT_APPENDS = Counter(
    "triloop_audit_appends_total",
    "Rows this process appended to the audit chain (log=chain) or the access log (log=access).",
    ["log", "decision"])
EPISODES_STORED = Counter(
    "triloop_episodes_stored_total",
    "Episodes this execution worker stored (rollout throughput), by purpose and status.",
    ["purpose", "status"])
EPISODE_STEPS_STORED = Counter(
    "triloop_episode_steps_stored_total",
    "Steps of the episodes this execution worker stored, by purpose.", ["purpose"])
TASK_QUEUE_BACKLOG = Gauge(
    "triloop_task_queue_backlog",
    "Tasks waiting on a Temporal task queue this worker polls (approximate, from the server).",
    ["namespace", "task_queue", "type"])

FAILED_CLOSED_PREFIX = "failed closed"


def decision_outcome(allow: bool, reasons: Iterable[str]) -> str:
    """The outcome label of a decision: allow, deny, or failed_closed (OPA gave no answer)."""
    if allow:
        return "allow"
    return "failed_closed" if any(r.startswith(FAILED_CLOSED_PREFIX) for r in reasons) else "deny"


def count_stored_episodes(episodes: Iterable[tuple[str, str, int]]) -> None:
    """Count stored episodes, each given as (purpose, status, number of steps)."""
    for purpose, status, steps in episodes:
        EPISODES_STORED.labels(purpose=_label(purpose), status=_label(status)).inc()
        EPISODE_STEPS_STORED.labels(purpose=_label(purpose)).inc(steps)


def _label(value: object) -> str:
    """An enum member's value, anything else as text (``Purpose.EVAL`` -> ``eval``)."""
    return str(getattr(value, "value", value))


class _EpisodeQueue(Collector):
    """The execution worker's slots, read at each scrape; only its process has them."""

    def __init__(self, busy: Callable[[], float], waiting: Callable[[], float]) -> None:
        self._busy, self._waiting = busy, waiting

    def describe(self) -> list[Metric]:
        """Nothing at registration: the families are whatever collect yields."""
        return []

    def collect(self) -> Iterator[Metric]:
        """Episodes playing, and episodes waiting for a slot (the worker's queue depth)."""
        yield GaugeMetricFamily("triloop_episode_slots_busy",
                                "Episodes this execution worker is playing now.",
                                value=self._busy())
        yield GaugeMetricFamily("triloop_episodes_waiting",
                                "Episodes queued on this execution worker, waiting for a free"
                                " slot (its queue depth).", value=self._waiting())


def watch_episode_queue(busy: Callable[[], float], waiting: Callable[[], float]) -> None:
    """Read the execution worker's slots at each scrape (the latest worker built wins)."""
    register_collector("episode_queue", _EpisodeQueue(busy, waiting))


_registered: dict[str, Collector] = {}
_registered_lock = threading.Lock()


def register_collector(name: str, collector: Collector) -> None:
    """Add a collector read at each scrape; registering ``name`` again replaces the old one.

    Tests build a worker many times in one process: each build's collector replaces the
    previous one instead of failing on a duplicate family.
    """
    with _registered_lock:
        old = _registered.pop(name, None)
        if old is not None:
            REGISTRY.unregister(old)
        REGISTRY.register(collector)
        _registered[name] = collector


def render() -> tuple[bytes, str]:
    """The process's metrics in Prometheus' text format, with its content type."""
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST


@dataclass(frozen=True)
class ScrapeRefusal:
    """Why a scrape is refused: the HTTP status and a sentence naming the way in."""

    status: int
    reason: str


def is_loopback(host: str | None) -> bool:
    """Whether a client address is on the loopback interface (127.0.0.0/8, ::1)."""
    if not host:
        return False
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host == "localhost"
    mapped = getattr(address, "ipv4_mapped", None)
    return bool(address.is_loopback or (mapped is not None and mapped.is_loopback))


def scrape_refusal(
    *, authorization: str | None, client_host: str | None, token: str | None
) -> ScrapeRefusal | None:
    """None when this request may read the metrics, else why not.

    1. A token is configured: the request must bear it (compared in constant time).
    2. None is configured: the client must be on the loopback interface.
    """
    if token:
        scheme, _, presented = (authorization or "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(presented.strip().encode(),
                                                              token.encode()):
            return None
        return ScrapeRefusal(401, "metrics need the metrics token: send "
                             "'Authorization: Bearer <token>' with the value of "
                             "TRILOOP_METRICS_TOKEN (or the metrics-token secret)")
    if is_loopback(client_host):
        return None
    return ScrapeRefusal(403, "no metrics token is configured, so metrics are served to "
                         "loopback clients only; set TRILOOP_METRICS_TOKEN (or the "
                         "metrics-token secret) to let a remote Prometheus scrape with it")


class MetricsServerError(RuntimeError):
    """A worker's metrics server could not start; the message names the setting to change."""


class _ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a slow scraper never holds the worker's shutdown


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base's name)
        """Scrapes every few seconds would flood the worker's log: say nothing."""


def _guarded(token: str | None) -> Callable[..., Iterable[bytes]]:
    metrics_app = make_wsgi_app(REGISTRY)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO", "/") not in ("/metrics", "/"):
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"metrics are at /metrics\n"]
        refusal = scrape_refusal(authorization=environ.get("HTTP_AUTHORIZATION"),
                                 client_host=environ.get("REMOTE_ADDR"), token=token)
        if refusal is not None:
            status = "401 Unauthorized" if refusal.status == 401 else "403 Forbidden"
            headers = [("Content-Type", "text/plain; charset=utf-8")]
            if refusal.status == 401:
                headers.append(("WWW-Authenticate", 'Bearer realm="triloop metrics"'))
            start_response(status, headers)
            return [refusal.reason.encode() + b"\n"]
        result: Iterable[bytes] = metrics_app(environ, start_response)
        return result

    return app


class MetricsServer:
    """A worker's /metrics, served from a daemon thread until ``close``."""

    def __init__(self, host: str, port: int, *, token: str | None, setting: str) -> None:
        try:
            self._server = make_server(host, port, _guarded(token), _ThreadingServer,
                                       handler_class=_QuietHandler)
        except OSError as exc:
            raise MetricsServerError(
                f"the metrics server cannot listen on {host}:{port} ({exc.strerror or exc}); "
                f"stop what holds the port, or set {setting} to another port (0: no metrics "
                "server)") from exc
        self.host = host
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="metrics-server", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        """Where Prometheus scrapes this server."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving and release the port."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def start_metrics_server(host: str, port: int, *, token: str | None,
                         setting: str) -> MetricsServer:
    """Serve this process's metrics on host:port (0: a free port); ``setting`` names the port's
    setting in the error if it is taken."""
    server = MetricsServer(host, port, token=token, setting=setting)
    if token is None and not is_loopback(host):
        log.warning("metrics on %s answer loopback clients only: no metrics token is set",
                    server.url)
    return server
