"""``triloop dev up | status | down | logs``: the whole stack on loopback, one process each.

Run as root, each process runs as its own OS user (``accounts``): what a service may read
of the stack's home is its own folder, ``services/<service>/`` (``secrets/`` and ``home/``,
0700, that user's), the shared folders of its groups, and nothing of ``secrets/``.
"""

from __future__ import annotations

import getpass
import importlib.util
import os
import shutil
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import cast

from sqlalchemy.engine import make_url

from triloop.config import (
    DEV_SESSION_SECRET,
    LOOPS,
    SERVICES,
    DatabaseRoleName,
    ServiceName,
    Settings,
)
from triloop.devstack.accounts import (
    ARTIFACTS_GROUP,
    FAULTS_GROUP,
    ServiceAccount,
    ensure_account,
    grant_traverse,
    own_folder,
    running_as,
    separate_users,
    shared_folder,
    take_back,
)
from triloop.devstack.postgres import provision_role_passwords, role_passwords, start_postgres
from triloop.devstack.processes import (
    ServiceProcess,
    ServiceStartError,
    port_in_use,
    recorded_process,
    start_process,
    stop_recorded,
    wait_until,
    without_credentials,
)
from triloop.devstack.secrets import ensure_session_secret
from triloop.devstack.servers import _http_ok, repo_root, start_opa, start_temporal, tool_path
from triloop.devstack.temporal_keys import ensure_tokens
from triloop.devstack.temporal_server import TemporalPorts, provision, start_temporal_server
from triloop.faults import faults_file
from triloop.secrets import (
    METRICS_TOKEN,
    OWNER_PASSWORD,
    ensure_secret,
    hand_out,
    opa_token_name,
    read_secret,
    role_password_name,
    temporal_token_name,
)

# Start order; down goes in reverse.
SERVICE_ORDER = (
    "postgres",
    "temporal",
    "opa",
    "verifier",
    "governance-worker",
    "execution-worker",
    "learning-worker",
    "web",
)
WORKER_MODULES = {
    "execution-worker": "execution_loop.worker",
    "learning-worker": "learning_loop.worker",
    "governance-worker": "governance_loop.worker",
}


@dataclass(frozen=True)
class StackPaths:
    """Where the embedded stack keeps its state."""

    home: Path

    @property
    def logs(self) -> Path:
        return self.home / "logs"

    @property
    def run(self) -> Path:
        return self.home / "run"

    def pid_file(self, name: str) -> Path:
        return self.run / f"{name}.pid"

    def service_dir(self, service: str) -> Path:
        """Root's folder around a service's own ``secrets/`` and ``home/``.

        Not the service's: it cannot swap either folder for a link to somewhere else.
        """
        return own_folder(self.home / "services" / service, None, 0o755)


def _check_port(name: str, port: int, paths: StackPaths) -> None:
    if recorded_process(paths.pid_file(name)) is None and port_in_use(port):
        raise ServiceStartError(
            f"{name}: port {port} on 127.0.0.1 is already taken by another program; "
            f"stop it or set the TRILOOP_* port for {name} (log would be {paths.logs / name}.log)"
        )


def service_env(
    settings: Settings, service: DatabaseRoleName, account: ServiceAccount | None = None
) -> dict[str, str]:
    """The environment of one service process: its own credentials and nobody else's.

    No credential of the invoking shell is passed on (``without_credentials``): the owner
    URL is left out (services never migrate), the role URL carries no password,
    ``TRILOOP_SECRETS_DIR`` is a folder holding only this service's secrets (``account``'s,
    0700, when it runs as its own user, with ``HOME`` beside it), and only ``web`` gets
    the console's session secret. The verifier holds its database password only: it asks
    no policy, drives no workflow and reads no artifact.
    """
    env = without_credentials(os.environ)
    env["TRILOOP_HOME"] = str(settings.home.resolve())
    env["TRILOOP_SERVICE"] = service
    env["PYTHONUNBUFFERED"] = "1"
    env[f"TRILOOP_DATABASE_URL_{service.upper()}"] = make_url(settings.role_url(service))._replace(
        password=None).render_as_string(hide_password=False)
    own = [role_password_name(service)]
    if service != "verifier":
        own.append(opa_token_name(service))
        if read_secret(settings.secrets, METRICS_TOKEN) is not None:  # scrapes need it
            own.append(METRICS_TOKEN)
        if settings.temporal_credential(service) is not None:
            own.append(temporal_token_name(service))
    folder = StackPaths(settings.home.resolve()).service_dir(service)
    owner = (account.uid, account.gid) if account else None
    env["TRILOOP_SECRETS_DIR"] = str(hand_out(settings.secrets.resolve(), folder / "secrets",
                                              own, owner=owner))
    if account is not None:
        env["HOME"] = str(own_folder(folder / "home", account))
    if service in LOOPS:  # the loops' artifact store; one key for all three (see docs)
        for key in ("artifact_s3_access_key_id", "artifact_s3_secret_access_key"):
            if (value := getattr(settings, key)) is not None:
                env[f"TRILOOP_{key.upper()}"] = value
    if service == "web":
        secret = settings.session_secret
        if secret == DEV_SESSION_SECRET:  # the operator set none: this install's own
            secret = ensure_session_secret(settings.home.resolve())
        env["TRILOOP_SESSION_SECRET"] = secret
    return env


def ensure_credentials(settings: Settings) -> None:
    """Generate every credential the stack needs, once per install (see triloop.secrets).

    Temporal tokens are signed afresh at every ``up`` (they expire); the quick-mode dev
    server checks none, so none are made for it.
    """
    folder = settings.secrets
    for service in SERVICES:
        ensure_secret(folder, opa_token_name(service))
    role_passwords(folder)
    if settings.temporal_mode == "server":
        ensure_tokens(settings, settings.home.resolve() / "temporal" / "jwks.json")


def up(settings: Settings, *, with_workers: bool = True) -> list[str]:
    """Start every service not already running; return the lines to print."""
    paths = StackPaths(settings.home.resolve())
    lines: list[str] = []
    temporal_port = int(settings.temporal_address.rsplit(":", 1)[1])
    opa_port = int(settings.opa_url.rsplit(":", 1)[1].split("/")[0])

    def running(name: str) -> bool:
        return recorded_process(paths.pid_file(name)) is not None

    ensure_credentials(settings)
    accounts = {name: ensure_account(name) for name in SERVICE_ORDER}
    if separate_users():
        prepare_for_service_users(settings, paths, accounts)
    if settings.database_url is None and not running("postgres"):
        _check_port("postgres", settings.pg_port, paths)
        start_postgres(
            paths.home / "pg", port=settings.pg_port, run_dir=paths.run, log_dir=paths.logs,
            owner_password=ensure_secret(settings.secrets, OWNER_PASSWORD),
        )
    if not running("temporal"):
        _check_port("temporal", temporal_port, paths)
        start_stack_temporal(settings, paths, temporal_port, account=accounts["temporal"])
    if not running("opa"):
        _check_port("opa", opa_port, paths)
        start_opa(policies=repo_root() / "policies", port=opa_port, run_dir=paths.run,
                  log_dir=paths.logs, secrets_dir=settings.secrets, account=accounts["opa"],
                  own_secrets=paths.service_dir("opa") / "secrets")

    from triloop.migrate import upgrade

    upgrade(settings.owner_url())
    provision_role_passwords(settings.owner_url(), role_passwords(settings.secrets))
    lines += [f"Temporal: created {made}" for made in provision(settings)]
    if with_workers:
        # The verifier first: offline eval waits for its verdicts on every eval episode.
        if not running("verifier"):
            _start_python("verifier", ["-m", "verifier"], settings, paths, service="verifier",
                          account=accounts["verifier"])
        for name, module in WORKER_MODULES.items():
            if not running(name) and importlib.util.find_spec(module) is not None:
                service = cast(ServiceName, name.split("-")[0])
                _start_python(name, ["-m", module], settings, paths, service=service,
                              account=accounts[name])
        if not running("web") and importlib.util.find_spec("web.app") is not None:
            _check_port("web", settings.web_port, paths)
            proc = _start_python(
                "web",
                ["-m", "uvicorn", "web.app:app", "--host", settings.web_host, "--port",
                 str(settings.web_port)],
                settings,
                paths,
                service="web",
                account=with_low_port(accounts["web"], settings.web_port),
            )
            wait_until(
                lambda: _http_ok(f"http://{settings.web_host}:{settings.web_port}/healthz"),
                name="web",
                log_path=proc.log_path,
                timeout_s=60,
                alive=lambda: recorded_process(proc.pid_path) is not None,
            )
    lines += [*urls(settings), users_line(), sandbox_line(settings)]
    return lines


def prepare_for_service_users(
    settings: Settings, paths: StackPaths, accounts: dict[str, ServiceAccount | None]
) -> None:
    """What the service users must reach: the code and tools, the home, shared folders.

    Traverse only on the parents of the interpreter, its packages, the checkout and the
    tools (``grant_traverse``); the folders services share each belong to one group.
    """
    needed = [Path(os.path.realpath(sys.executable)), Path(sys.prefix), repo_root(),
              paths.home / "services"]
    needed += [Path(entry) for entry in sys.path if entry.endswith("-packages")]
    tools = ["opa", "temporal-server" if settings.temporal_mode == "server" else "temporal"]
    needed += [Path(os.path.realpath(tool_path(tool))) for tool in tools]
    for path in needed:
        grant_traverse(path)
    shared_folder(settings.artifacts, owner=accounts["learning-worker"], group=ARTIFACTS_GROUP)
    shared_folder(settings.artifact_cache, owner=None, group=ARTIFACTS_GROUP, group_writes=True)
    shared_folder(faults_file(paths.home).parent, owner=accounts["web"], group=FAULTS_GROUP)


def unprivileged_port_start() -> int:
    """The lowest port an ordinary user may bind on this kernel (usually 1024)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_unprivileged_port_start").read_text())
    except (OSError, ValueError):
        return 1024


def with_low_port(account: ServiceAccount | None, port: int) -> ServiceAccount | None:
    """A service on a port below the unprivileged range keeps CAP_NET_BIND_SERVICE only."""
    if account is None or port >= unprivileged_port_start():
        return account
    return replace(account, capabilities=("net_bind_service",))


def start_stack_temporal(settings: Settings, paths: StackPaths, port: int, *,
                         account: ServiceAccount | None = None) -> ServiceProcess:
    """The real server with authorization (default), or the dev server in quick mode.

    Quick mode's dev server authenticates nobody anyway; it runs as the invoking user.
    """
    if settings.temporal_mode == "server":
        if account is not None:  # its config is written before it is given its folder
            take_back(paths.home / "temporal")
        return start_temporal_server(
            settings, state_dir=paths.home / "temporal",
            ports=TemporalPorts.for_stack(paths.home / "temporal", port),
            run_dir=paths.run, log_dir=paths.logs, binary=tool_path("temporal-server"),
            account=account)
    return start_temporal(
        db_file=paths.home / "temporal.db", port=port, ui_port=settings.temporal_ui_port,
        http_port=port + 10, metrics_port=port + 20, run_dir=paths.run, log_dir=paths.logs,
        namespaces=[settings.temporal_namespace(loop) for loop in LOOPS])


def _start_python(
    name: str, args: list[str], settings: Settings, paths: StackPaths, *,
    service: DatabaseRoleName, account: ServiceAccount | None,
) -> ServiceProcess:
    return start_process(
        name,
        [sys.executable, *args],
        run_dir=paths.run,
        log_dir=paths.logs,
        env=service_env(settings, service, account),
        cwd=repo_root(),
        account=account,
    )


def urls(settings: Settings) -> list[str]:
    """Where each service listens."""
    host = settings.temporal_address.rsplit(":", 1)[0]
    return [
        f"PostgreSQL  {make_url(settings.owner_url()).render_as_string(hide_password=True)}",
        f"Temporal    {settings.temporal_address} ({temporal_mode_line(settings, host)})",
        f"OPA         {settings.opa_url}",
        f"Console     http://{settings.web_host}:{settings.web_port}/",
        f"Metrics     {metrics_line(settings)}",
    ]


def metrics_line(settings: Settings) -> str:
    """Where Prometheus scrapes each service, and how it is let in."""
    workers = ", ".join(f"{loop} :{settings.metrics_port(loop)}" for loop in LOOPS
                        if settings.metrics_port(loop))
    guard = ("with the metrics token" if settings.metrics_scrape_token()
             else "loopback clients only (no metrics token)")
    return (f"web /metrics; workers on {settings.metrics_host} ({workers or 'none'}); "
            f"{guard}")


def temporal_mode_line(settings: Settings, host: str) -> str:
    """What kind of Temporal runs, said plainly: the dev server authenticates nobody."""
    if settings.temporal_mode == "dev":
        return (f"dev server, UNAUTHENTICATED: any local process may drive workflows;"
                f" UI http://{host}:{settings.temporal_ui_port}")
    return "real server, JWT authorization on; one namespace per loop"


def users_line() -> str:
    """Whether the services share one OS user, said plainly (``dev up`` and ``status``)."""
    if separate_users():
        return ("OS users    each service runs as its own OS user (triloop-<service>); its"
                " secrets folder is its alone")
    return (f"OS users    shared: every service runs as {getpass.getuser()} (not root, so no"
            " per-service users): any service can read the others' secrets")


def sandbox_line(settings: Settings) -> str:
    """Where agent code runs, said plainly (``dev up`` and ``status``): the stack's setting."""
    if settings.sandbox == "local":
        return ("Sandbox     UNISOLATED: TRILOOP_SANDBOX=local (a development setting); agent"
                " code runs with rlimits only, and each episode's record says so")
    if shutil.which("bwrap") is None:
        return ("Sandbox     bubblewrap required, but bwrap is not installed: agent code is"
                " refused (admission and episodes) until Debian's package bubblewrap is")
    return ("Sandbox     bubblewrap: agent code runs isolated; refused where bubblewrap cannot"
            " run (TRILOOP_SANDBOX=local runs it unisolated, for development)")


def status(settings: Settings) -> list[tuple[str, str, str]]:
    """(service, state, log file) for every service of the stack."""
    paths = StackPaths(settings.home.resolve())
    rows = []
    for name in SERVICE_ORDER:
        proc = recorded_process(paths.pid_file(name))
        state = (f"running (pid {proc.pid}) as {running_as(proc.uids().real)}" if proc
                 else "stopped")
        if name == "postgres" and settings.database_url:
            state = "external (TRILOOP_DATABASE_URL)"
        if name == "temporal" and proc:
            state += "; " + temporal_mode_line(settings, "127.0.0.1")
        rows.append((name, state, str(paths.logs / f"{name}.log")))
    return rows


def down(settings: Settings) -> list[str]:
    """Stop what ``up`` started, in reverse order; return the names stopped."""
    paths = StackPaths(settings.home.resolve())
    stopped = []
    for name in reversed(SERVICE_ORDER):
        if stop_recorded(paths.pid_file(name)):
            stopped.append(name)
    return stopped


def log_path(settings: Settings, name: str) -> Path:
    """The log file of one service."""
    if name not in SERVICE_ORDER:
        raise ValueError(f"unknown service '{name}'; one of: {', '.join(SERVICE_ORDER)}")
    return StackPaths(settings.home.resolve()).logs / f"{name}.log"
