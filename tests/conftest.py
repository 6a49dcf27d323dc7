"""Session fixtures: real PostgreSQL, Temporal and OPA, started on free loopback ports.

Each service starts only when a test asks for it, in a temporary directory, and
is stopped at the end of the session: tests never touch a developer's stack.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from triloop.config import ServiceName, Settings
from triloop.devstack.postgres import provision_role_passwords, role_passwords, start_postgres
from triloop.devstack.processes import ServiceProcess, free_port, stop_recorded
from triloop.devstack.servers import repo_root, start_opa, tool_path
from triloop.devstack.temporal_server import TemporalPorts, provision, start_temporal_server
from triloop.secrets import OWNER_PASSWORD, ensure_secret

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# No worker a test serves (in process or as `python -m ...worker`) binds a fixed /metrics
# port that another session on the machine may hold; tests of /metrics pick a free port.
for _loop in ("EXECUTION", "LEARNING", "GOVERNANCE"):
    os.environ.setdefault(f"TRILOOP_METRICS_PORT_{_loop}", "0")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--reverse-order", action="store_true",
        help="run the collected tests in reverse order, to find tests that depend on the"
        " order they run in or on rows another test left behind",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--reverse-order"):
        items.reverse()


@pytest.fixture(scope="session")
def stack_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Temporary home of the test stack."""
    return tmp_path_factory.mktemp("triloop-stack")


@pytest.fixture(scope="session")
def pg_server(stack_dir: Path) -> Iterator[tuple[ServiceProcess, int]]:
    """A throwaway PostgreSQL cluster (fsync off), migrated to head."""
    from triloop.migrate import upgrade

    port = free_port()
    secrets_dir = stack_dir / "secrets"
    proc = start_postgres(
        stack_dir / "pg", port=port, run_dir=stack_dir / "run", log_dir=stack_dir / "logs",
        owner_password=ensure_secret(secrets_dir, OWNER_PASSWORD), durable=False,
    )
    url = Settings(home=stack_dir, pg_port=port).owner_url()
    upgrade(url)
    provision_role_passwords(url, role_passwords(secrets_dir))
    yield proc, port
    from triloop.db import dispose_all

    dispose_all()
    stop_recorded(proc.pid_path)


@pytest.fixture(scope="session")
def database_url(stack_dir: Path, pg_server: tuple[ServiceProcess, int]) -> str:
    """Owner URL of the test database, with the owner's password."""
    return Settings(home=stack_dir, pg_port=pg_server[1]).owner_url()


@pytest.fixture(scope="session")
def temporal_server(stack_dir: Path) -> Iterator[tuple[ServiceProcess, str]]:
    """The real Temporal server, JWT authorization on, with the loops' namespaces."""
    ports = TemporalPorts.free()
    address = f"127.0.0.1:{ports.frontend}"
    admin = Settings(home=stack_dir, temporal_address=address)
    proc = start_temporal_server(
        admin, state_dir=stack_dir / "temporal", ports=ports, run_dir=stack_dir / "run",
        log_dir=stack_dir / "logs", binary=tool_path("temporal-server"),
    )
    provision(admin)
    yield proc, address
    stop_recorded(proc.pid_path)


@pytest.fixture(scope="session")
def temporal_address(temporal_server: tuple[ServiceProcess, str]) -> str:
    """host:port of the test Temporal server."""
    return temporal_server[1]


@pytest.fixture(scope="session")
def opa_server(stack_dir: Path) -> Iterator[tuple[ServiceProcess, str]]:
    """The real OPA server on the project's policies, decision logging on."""
    port = free_port()
    proc = start_opa(
        policies=repo_root() / "policies", port=port, run_dir=stack_dir / "run",
        log_dir=stack_dir / "logs", secrets_dir=stack_dir / "secrets",
    )
    yield proc, f"http://127.0.0.1:{port}"
    stop_recorded(proc.pid_path)


@pytest.fixture(scope="session")
def opa_url(opa_server: tuple[ServiceProcess, str]) -> str:
    """Base URL of the test OPA server."""
    return opa_server[1]


@pytest.fixture(scope="session")
def db_settings(stack_dir: Path, database_url: str) -> Settings:
    """Settings pointing at the test database only."""
    return Settings(
        home=stack_dir, database_url=database_url, artifact_dir=stack_dir / "artifacts",
        opa_url="http://127.0.0.1:9",
    )


@pytest.fixture(scope="session")
def opa_tokens(stack_dir: Path, opa_server: tuple[ServiceProcess, str]) -> dict[str, str]:
    """Every service's OPA bearer token (the test plays every service)."""
    return Settings(home=stack_dir).opa_tokens()


@pytest.fixture(scope="session")
def settings(
    stack_dir: Path, database_url: str, temporal_address: str, opa_url: str
) -> Settings:
    """Settings pointing at every test service; a unique task-queue prefix per session.

    The test plays every service: the stack's secrets hold each one's credentials.
    """
    settings = Settings(
        home=stack_dir,
        database_url=database_url,
        temporal_address=temporal_address,
        opa_url=opa_url,
        artifact_dir=stack_dir / "artifacts",
        task_queue_prefix=f"test-{uuid.uuid4().hex[:8]}-",
        gate_profile="test",
    )
    provision(settings)
    return settings


@pytest.fixture(scope="session")
def owner_engine(database_url: str) -> Engine:
    """The owner (superuser) engine: test set-up only, never code under test."""
    from triloop.db import engine_for_url

    return engine_for_url(database_url)


@pytest.fixture(scope="session")
def role_engine(db_settings: Settings) -> Callable[[ServiceName], Engine]:
    """Engine factory for a service's own database role."""
    from triloop.db import role_engine as make

    return lambda service: make(db_settings, service)


@pytest.fixture(scope="session")
def verifier_service(settings: Settings) -> Iterator[None]:
    """The verifier (``verifier/``) as ``triloop_verifier``, judging episodes in a thread
    for the rest of the session, as ``triloop dev up`` runs it in its own process."""
    import threading

    from execution_loop.serving import TaskEnvironments
    from triloop.db import role_engine as make
    from verifier.service import run_forever

    engine = make(settings, "verifier")
    stop = threading.Event()
    thread = threading.Thread(
        target=run_forever, name="verifier", daemon=True,
        kwargs={"engine": engine, "environments": TaskEnvironments(engine=engine),
                "stop": stop, "poll_s": 0.2})
    thread.start()
    yield
    stop.set()
    thread.join(timeout=60)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model (seed 0), created locally once per session: no download."""
    import torch

    from learning_loop.tiny_model import create_tiny_model

    torch.set_num_threads(1)
    return create_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="module")
def tiny_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's tiny model, copied for one test module.

    Same weights, so the same checkpoint id; a module that writes beside it (a saved
    checkpoint, an edited config) cannot change what another module reads.
    """
    return Path(shutil.copytree(tiny_model_dir, tmp_path_factory.mktemp("tiny") / "model"))
