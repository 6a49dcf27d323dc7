"""The real Temporal server on loopback: SQLite persistence, JWT authorization on.

``bootstrap.sh`` builds the server from ``tools/temporal-server`` (the pinned server module
with triloop's authorizer) into the cache and links it as ``.triloop/bin/temporal-server``.
This module writes its config, starts it, and provisions what the loops need: one
namespace per loop and the Nexus endpoints through which loops call each other.

Who gets in where:

- the public frontend (gRPC): every caller shows a token (see ``temporal_keys``); the
  default claim mapper reads it, triloop's authorizer narrows the service tokens and the
  default authorizer then asks for ``write`` in the namespace a call changes;
- every other port (the internal frontend's gRPC and HTTP, the public HTTP port, history,
  matching, worker, and each service's ring membership port): mutual TLS with the
  server's own certificate (``temporal_tls``), which only the server's process holds. The
  internal frontend grants its callers everything, so that certificate is its lock;
- no metrics or pprof listener: nothing reads them.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import yaml
from temporalio.client import Client

from triloop import search_attributes
from triloop.config import LOOPS, Settings
from triloop.devstack.accounts import ServiceAccount
from triloop.devstack.processes import (
    ServiceProcess,
    free_port,
    port_in_use,
    start_process,
    wait_until,
)
from triloop.devstack.temporal_keys import ADMIN, authorizer_policy, ensure_tokens
from triloop.devstack.temporal_tls import (
    InternodeTLS,
    ensure_internode_tls,
    internode_tls_config,
)
from triloop.nexus_api import ENDPOINT_TARGETS, endpoint_name
from triloop.temporal import DATA_CONVERTER

SERVER_LOG_LEVEL = "warn"
NAMESPACE_RETENTION_DAYS = 7
# The internal frontend is what the server's own components use (their certificate, no
# token); the public frontend, the only one a client reaches, checks every token.
SERVER_SERVICES = ("frontend", "internal-frontend", "history", "matching", "worker")


@dataclass(frozen=True)
class TemporalPorts:
    """Every port the server's services bind on 127.0.0.1 (only ``frontend`` takes tokens;
    every other one asks for the server's certificate)."""

    frontend: int
    http: int
    frontend_membership: int
    internal_frontend: int
    internal_frontend_membership: int
    # The server's own components deliver Nexus requests over the internal frontend's HTTP.
    internal_http: int
    history: int
    history_membership: int
    matching: int
    matching_membership: int
    worker: int
    worker_membership: int

    @classmethod
    def from_base(cls, frontend: int) -> TemporalPorts:
        """The fixed layout of ``dev up`` around the frontend port (7233 by default)."""
        return cls(frontend=frontend, http=frontend + 10, frontend_membership=frontend - 300,
                   internal_frontend=frontend + 3, internal_frontend_membership=frontend - 297,
                   internal_http=frontend + 13,
                   history=frontend + 1, history_membership=frontend - 299,
                   matching=frontend + 2, matching_membership=frontend - 298,
                   worker=frontend + 6, worker_membership=frontend - 294)

    @classmethod
    def free(cls, frontend: int | None = None) -> TemporalPorts:
        """Free ports only (tests, benchmarks)."""
        ports: list[int] = [frontend] if frontend else []
        while len(ports) < len(fields(cls)):  # all distinct
            port = free_port()
            if port not in ports:
                ports.append(port)
        return cls(*ports)

    @classmethod
    def for_stack(cls, state_dir: Path, frontend: int) -> TemporalPorts:
        """The ports a stack's server used before, else the fixed layout if it is free.

        Kept in ``ports.json`` so a restarted server finds its own membership ports again.
        """
        saved = state_dir / "ports.json"
        known = {f.name for f in fields(cls)}
        if saved.exists():
            recorded = json.loads(saved.read_text())
            if set(recorded) >= known and recorded["frontend"] == frontend:
                # An older layout's extra ports (metrics) are no longer bound.
                return cls(**{name: recorded[name] for name in known})
        ports = cls.from_base(frontend)
        if any(port_in_use(p) for p in asdict(ports).values() if p != frontend):
            ports = cls.free(frontend)
        state_dir.mkdir(parents=True, exist_ok=True)
        saved.write_text(json.dumps(asdict(ports)))
        return ports


# Headers a workflow may not set on a Nexus request it schedules: the server's defaults,
# plus the link through which a handler learns its caller (``triloop.nexus_caller``), so
# that only the server writes it.
DISALLOWED_NEXUS_HEADERS = [
    "request-timeout", "xdc-redirection-api", "xdc-redirection-source-cell", "xdc-redirection",
    "caller-name", "caller-type", "call-initiation", "temporal-principal-type",
    "temporal-principal-name", "nexus-link",
]
DYNAMIC_CONFIG = {
    # Refusals say why (an expired token, a missing role) instead of only "unauthorized".
    "frontend.exposeAuthorizerErrors": [{"value": True}],
    # The ring membership ports speak the same mutual TLS as the services' gRPC ports.
    "system.enableRingpopTLS": [{"value": True}],
    # Both of the server's Nexus operation implementations read their own key.
    "component.nexusoperations.disallowedHeaders": [{"value": DISALLOWED_NEXUS_HEADERS}],
    "nexusoperation.disallowedHeaders": [{"value": DISALLOWED_NEXUS_HEADERS}],
}


def server_config(*, db_file: Path, jwks: Path, dynamic_config: Path,
                  ports: TemporalPorts, tls: InternodeTLS) -> dict[str, object]:
    """The server's YAML config as a dict: one SQLite file, JWT authorization on the public
    frontend, mutual TLS with the server's own certificate everywhere else."""
    sqlite = {"sql": {
        "pluginName": "sqlite", "databaseName": str(db_file), "connectAddr": "localhost",
        "connectProtocol": "tcp",
        "connectAttributes": {"mode": "rwc", "setup": "true", "journal_mode": "wal",
                              "synchronous": "2"},
        "maxConns": 1, "maxIdleConns": 1, "maxConnLifetime": "1h",
    }}

    def rpc(grpc: int, membership: int, http: int | None = None) -> dict[str, object]:
        spec: dict[str, object] = {"grpcPort": grpc, "membershipPort": membership,
                                   "bindOnLocalHost": True}
        if http is not None:
            spec["httpPort"] = http
        return {"rpc": spec}

    address = f"127.0.0.1:{ports.frontend}"
    return {
        "log": {"stdout": True, "level": SERVER_LOG_LEVEL},
        "persistence": {"defaultStore": "sqlite", "visibilityStore": "sqlite",
                        "numHistoryShards": 1, "datastores": {"sqlite": sqlite}},
        "global": {
            "membership": {"maxJoinDuration": "30s", "broadcastAddress": "127.0.0.1"},
            "tls": internode_tls_config(tls),
            "authorization": {
                "authorizer": "default", "claimMapper": "default",
                "jwtKeyProvider": {"keySourceURIs": [jwks.resolve().as_uri()],
                                   "refreshInterval": "1m"},
            },
        },
        "services": {
            "frontend": rpc(ports.frontend, ports.frontend_membership, ports.http),
            "internal-frontend": rpc(ports.internal_frontend, ports.internal_frontend_membership,
                                     ports.internal_http),
            "history": rpc(ports.history, ports.history_membership),
            "matching": rpc(ports.matching, ports.matching_membership),
            "worker": rpc(ports.worker, ports.worker_membership),
        },
        "clusterMetadata": {
            "enableGlobalNamespace": False, "failoverVersionIncrement": 10,
            "masterClusterName": "active", "currentClusterName": "active",
            "clusterInformation": {"active": {
                "enabled": True, "initialFailoverVersion": 1, "rpcName": "frontend",
                "rpcAddress": address, "httpAddress": f"127.0.0.1:{ports.http}"}},
        },
        "dcRedirectionPolicy": {"policy": "noop"},
        "dynamicConfigClient": {"filepath": str(dynamic_config), "pollInterval": "60s"},
    }


def start_temporal_server(
    settings: Settings,
    *,
    state_dir: Path,
    ports: TemporalPorts,
    run_dir: Path,
    log_dir: Path,
    binary: str,
    name: str = "temporal",
    account: ServiceAccount | None = None,
) -> ServiceProcess:
    """Write keys, tokens, the server's certificate and config under ``state_dir``, start
    the server, wait for it.

    With ``account`` the server runs as that user, who is then given ``state_dir`` (its
    certificate's folder included).
    """
    state_dir.mkdir(parents=True, exist_ok=True)
    jwks = state_dir / "jwks.json"
    ensure_tokens(settings, jwks)
    tls = ensure_internode_tls(internode_secrets(state_dir))
    dynamic = state_dir / "dynamic-config.yaml"
    dynamic.write_text(yaml.safe_dump(DYNAMIC_CONFIG))
    policy_file = state_dir / "authorization.json"
    policy_file.write_text(json.dumps(authorizer_policy(settings), indent=2))
    config_file = state_dir / "config.yaml"
    config_file.write_text(yaml.safe_dump(server_config(
        db_file=state_dir / "temporal.db", jwks=jwks, dynamic_config=dynamic, ports=ports,
        tls=tls), sort_keys=False))
    argv = [binary, "--config-file", str(config_file), "--policy-file", str(policy_file)]
    for service in SERVER_SERVICES:
        argv += ["--service", service]
    proc = start_process(name, argv, run_dir=run_dir, log_dir=log_dir, account=account,
                         owns=(state_dir,))
    from triloop.devstack.servers import _alive, _tcp_open

    wait_until(lambda: _tcp_open(ports.frontend), name=name, log_path=proc.log_path,
               timeout_s=90, alive=lambda: _alive(proc))
    return proc


def internode_secrets(state_dir: Path) -> Path:
    """The server's own secrets folder: its certificate and key, nobody else's."""
    return state_dir / "secrets"


def provision(settings: Settings, *, timeout_s: float = 60.0) -> list[str]:
    """Create each loop's namespace and the Nexus endpoints, if missing; say what was made.

    Runs with the operator's own token (``temporal-system:admin``), which no service holds.
    """
    return asyncio.run(provision_async(settings, timeout_s=timeout_s))


async def provision_async(settings: Settings, *, timeout_s: float = 60.0) -> list[str]:
    """``provision`` from inside an event loop."""
    from google.protobuf.duration_pb2 import Duration
    from temporalio.api.nexus.v1 import EndpointSpec, EndpointTarget
    from temporalio.api.operatorservice.v1 import (
        CreateNexusEndpointRequest,
        ListNexusEndpointsRequest,
    )
    from temporalio.api.workflowservice.v1 import (
        DescribeNamespaceRequest,
        RegisterNamespaceRequest,
    )
    from temporalio.service import RPCError, RPCStatusCode

    token = settings.temporal_credential(ADMIN)
    client = await _connect_when_up(settings, token, timeout_s)
    made: list[str] = []
    for loop in LOOPS:
        namespace = settings.temporal_namespace(loop)
        try:
            await client.workflow_service.register_namespace(RegisterNamespaceRequest(
                namespace=namespace, description=f"triloop {loop} loop",
                workflow_execution_retention_period=Duration(
                    seconds=NAMESPACE_RETENTION_DAYS * 86400)))
            made.append(f"namespace {namespace}")
        except RPCError as exc:
            if exc.status != RPCStatusCode.ALREADY_EXISTS:
                raise
    deadline = time.monotonic() + timeout_s
    for loop in LOOPS:  # registered namespaces reach the frontend's cache within seconds
        request = DescribeNamespaceRequest(namespace=settings.temporal_namespace(loop))
        while True:
            try:
                await client.workflow_service.describe_namespace(request)
                break
            except RPCError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)
    made += await _register_search_attributes(client, settings)
    existing = {e.spec.name for e in (await client.operator_service.list_nexus_endpoints(
        ListNexusEndpointsRequest(page_size=1000))).endpoints}
    for server, queue in ENDPOINT_TARGETS.items():
        name = endpoint_name(settings.task_queue_prefix, server)
        if name in existing:
            continue
        target = EndpointTarget(worker=EndpointTarget.Worker(
            namespace=settings.temporal_namespace(server), task_queue=settings.task_queue(queue)))
        await client.operator_service.create_nexus_endpoint(CreateNexusEndpointRequest(
            spec=EndpointSpec(name=name, target=target)))
        made.append(f"Nexus endpoint {name}")
    return made


async def _register_search_attributes(client: Client, settings: Settings) -> list[str]:
    """triloop's search attributes (``triloop.search_attributes``) in each loop's namespace."""
    from temporalio.api.enums.v1 import IndexedValueType
    from temporalio.api.operatorservice.v1 import (
        AddSearchAttributesRequest,
        ListSearchAttributesRequest,
    )

    made: list[str] = []
    for loop in LOOPS:
        namespace = settings.temporal_namespace(loop)
        listed = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace=namespace))
        missing = {key.name: IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD
                   for key in search_attributes.ALL
                   if key.name not in listed.custom_attributes}
        if missing:
            await client.operator_service.add_search_attributes(AddSearchAttributesRequest(
                search_attributes=missing, namespace=namespace))
            made.append(f"search attributes {', '.join(sorted(missing))} in {namespace}")
    return made


async def _connect_when_up(settings: Settings, token: str | None, timeout_s: float) -> Client:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await Client.connect(settings.temporal_address, namespace="temporal-system",
                                        api_key=token, tls=False, identity="triloop-dev-up",
                                        data_converter=DATA_CONVERTER)
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)
