"""Background service processes: start with a log file and a pid file, wait, stop.

``down`` stops only what ``up`` started: each started process records its pid
(and its start time, so a recycled pid is never killed by mistake).
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from triloop.devstack.accounts import ServiceAccount, hand_over


class ServiceStartError(RuntimeError):
    """A service did not come up; the message names it and its log file."""


@dataclass(frozen=True)
class ServiceProcess:
    """A started service: name, pid, and where its log and pid file are."""

    name: str
    pid: int
    log_path: Path
    pid_path: Path


def _ephemeral_range() -> tuple[int, int]:
    """The ports the kernel hands out as the source port of outgoing connections."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now, outside the kernel's ephemeral range.

    A port the kernel picked with ``bind(0)`` comes from the ephemeral range, the same
    range it draws source ports of outgoing connections from: between our check and the
    service's own bind, one of the many client connections on the machine could take it
    ("address already in use"). Ports below (or above) the range are never taken that way.
    """
    low, high = _ephemeral_range()
    candidates = range(10_000, low) if low > 11_000 else range(high + 1, 65_536)
    chooser = random.SystemRandom()
    for port in chooser.sample(candidates, min(200, len(candidates))):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something already listens on host:port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.2)
        return sock.connect_ex((host, port)) == 0


def without_credentials(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` minus every variable that may carry one of the stack's credentials.

    A service is handed its own credentials explicitly (``stack.service_env``); what the
    invoking shell holds (the owner's URL, another service's token or password, the
    session secret, an S3 key) reaches none of them.
    """
    return {name: value for name, value in environ.items() if not _is_credential(name)}


def _is_credential(name: str) -> bool:
    upper = name.upper()
    if upper.startswith("TRILOOP_DATABASE_URL") or upper in ("PGPASSWORD", "PGPASSFILE"):
        return True
    return upper.startswith("TRILOOP_") and any(
        word in upper for word in ("TOKEN", "SECRET", "PASSWORD", "_KEY"))


def start_process(
    name: str,
    argv: Sequence[str],
    *,
    run_dir: Path,
    log_dir: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    account: ServiceAccount | None = None,
    owns: Sequence[Path] = (),
) -> ServiceProcess:
    """Start ``argv`` detached in its own session, logging to ``log_dir/name.log``.

    Without ``env`` the child inherits this environment without any credential
    (``without_credentials``). With ``account`` it runs as that user, its group and its
    shared groups only, owning its log file and the folders in ``owns`` (its state).
    """
    inherited = env is None
    env = without_credentials(os.environ) if env is None else dict(env)
    run_dir.mkdir(parents=True, exist_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    pid_path = run_dir / f"{name}.pid"
    if account is not None:
        for folder in (run_dir, log_dir):
            _keep_own(folder)
        for folder in owns:
            hand_over(folder, account)
        env.update(USER=account.user, LOGNAME=account.user)
        if inherited:  # the invoking user's HOME is not the service's to write
            env["HOME"] = str(owns[0]) if owns else "/nonexistent"
    # Never through a link: a log folder is ours, but an older one may not have been.
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "ab") as log:
        if account is not None:
            os.fchown(fd, account.uid, account.gid)
            os.fchmod(fd, 0o600)
        proc = subprocess.Popen(
            _as_account(list(argv), account),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
            start_new_session=True,
            **popen_user(account),
        )
    created = psutil.Process(proc.pid).create_time()
    pid_path.write_text(json.dumps({"pid": proc.pid, "created": created, "argv": list(argv)}))
    return ServiceProcess(name=name, pid=proc.pid, log_path=log_path, pid_path=pid_path)


def _keep_own(folder: Path) -> None:
    """The run and log folders stay ours: a service that owned one could plant links."""
    if folder.stat().st_uid != os.geteuid():
        os.chown(folder, os.geteuid(), os.getegid(), follow_symlinks=False)


def popen_user(account: ServiceAccount | None) -> dict[str, Any]:
    """Popen's own switch: uid, gid and exactly the shared groups (root's are dropped)."""
    if account is None or account.capabilities:
        return {}
    return {"user": account.uid, "group": account.gid, "extra_groups": list(account.groups)}


def _as_account(argv: list[str], account: ServiceAccount | None) -> list[str]:
    """A process that keeps a capability (a port below 1024) switches user with setpriv.

    ``setpriv`` drops every capability but those named, as ambient ones, so the service
    can bind its port and nothing more a root process could do.
    """
    if account is None or not account.capabilities:
        return argv
    caps = ",".join(f"+{cap}" for cap in account.capabilities)
    groups = ",".join(map(str, account.groups))
    return ["setpriv", f"--reuid={account.uid}", f"--regid={account.gid}",
            f"--groups={groups}" if groups else "--clear-groups",
            f"--inh-caps=-all,{caps}", f"--ambient-caps=-all,{caps}", "--", *argv]


def recorded_process(pid_path: Path) -> psutil.Process | None:
    """The live process a pid file recorded, or None if it is gone or the pid was reused."""
    try:
        record = json.loads(pid_path.read_text())
        proc = psutil.Process(int(record["pid"]))
        if abs(proc.create_time() - float(record["created"])) > 1.0:
            return None
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc
    except (FileNotFoundError, ValueError, KeyError, psutil.NoSuchProcess):
        return None


def stop_recorded(pid_path: Path, *, timeout_s: float = 15.0) -> bool:
    """Stop the process group a pid file recorded; True if something was stopped."""
    proc = recorded_process(pid_path)
    pid_path.unlink(missing_ok=True)
    if proc is None:
        return False
    try:
        pgid = os.getpgid(proc.pid)
        os.killpg(pgid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return False
    try:
        proc.wait(timeout=timeout_s)
    except psutil.TimeoutExpired:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=5)
    # Children that left the group (none expected) are not ours to chase.
    return True


def wait_until(
    check: Callable[[], bool],
    *,
    name: str,
    log_path: Path,
    timeout_s: float,
    alive: Callable[[], bool] | None = None,
) -> None:
    """Poll ``check`` until true; raise naming the service and its log if it never is."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        if alive is not None and not alive():
            raise ServiceStartError(
                f"{name} exited during start-up; see its log: {log_path}\n{tail(log_path)}"
            )
        time.sleep(0.2)
    raise ServiceStartError(
        f"{name} did not become ready within {timeout_s:.0f}s; see its log: {log_path}\n"
        f"{tail(log_path)}"
    )


def tail(path: Path, lines: int = 15) -> str:
    """The last lines of a log file, for error messages."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return "(no log written)"
    return "\n".join("    " + line for line in text[-lines:])
