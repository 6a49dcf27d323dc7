"""A throwaway stack (PostgreSQL, Temporal, OPA) in a temporary directory, for benchmarks.

Free loopback ports, migrated to head, stopped and deleted on exit; a developer's
running stack is never touched.
"""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from triloop.config import Settings


@contextmanager
def ephemeral_stack(*, queue_prefix: str | None = None) -> Iterator[Settings]:
    """Start the three services; yield settings pointing at them; stop them after."""
    from triloop.db import dispose_all
    from triloop.devstack.postgres import (
        provision_role_passwords,
        role_passwords,
        start_postgres,
    )
    from triloop.devstack.processes import ServiceProcess, free_port, stop_recorded
    from triloop.devstack.servers import repo_root, start_opa, tool_path
    from triloop.devstack.temporal_server import (
        TemporalPorts,
        provision,
        start_temporal_server,
    )
    from triloop.migrate import upgrade
    from triloop.secrets import OWNER_PASSWORD, ensure_secret

    prefix = queue_prefix or f"bench-{uuid.uuid4().hex[:6]}-"
    with tempfile.TemporaryDirectory(prefix="triloop-ephemeral-") as tmp:
        home = Path(tmp)
        run, logs = home / "run", home / "logs"
        procs: list[ServiceProcess] = []
        try:
            pg_port, o_port = free_port(), free_port()
            t_ports = TemporalPorts.free()
            secrets_dir = home / "secrets"
            procs.append(start_postgres(
                home / "pg", port=pg_port, run_dir=run, log_dir=logs,
                owner_password=ensure_secret(secrets_dir, OWNER_PASSWORD)))
            admin = Settings(home=home, temporal_address=f"127.0.0.1:{t_ports.frontend}")
            procs.append(start_temporal_server(
                admin, state_dir=home / "temporal", ports=t_ports, run_dir=run, log_dir=logs,
                binary=tool_path("temporal-server")))
            procs.append(start_opa(policies=repo_root() / "policies", port=o_port, run_dir=run,
                                   log_dir=logs, secrets_dir=secrets_dir))
            url = Settings(home=home, pg_port=pg_port).owner_url()
            upgrade(url)
            provision_role_passwords(url, role_passwords(secrets_dir))
            settings = Settings(
                home=home, database_url=url, temporal_address=admin.temporal_address,
                opa_url=f"http://127.0.0.1:{o_port}", task_queue_prefix=prefix)
            provision(settings)
            yield settings
        finally:
            dispose_all()
            for proc in reversed(procs):
                stop_recorded(proc.pid_path)
