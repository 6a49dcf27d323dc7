"""Sandbox backends that isolate agent code, and which one a worker uses by default.

``BubblewrapSandbox`` (Debian's ``bubblewrap``) runs each command in its own user, mount,
PID, IPC, UTS and network namespaces:

- no network: only a loopback of its own (the host's services are unreachable);
- a read-only system: ``/usr`` (and its ``/bin``, ``/lib`` links), ``/etc`` and the
  Python installation, nothing else of the host: not the project, not the verifier's
  files, not other episodes' folders; ``expose`` adds read-only folders a triloop
  verifier needs;
- a private writable work directory (the command's ``workdir``), a private ``/tmp``;
- its own ``/proc``: host processes are invisible;
- named endpoints only through a per-command relay (``sandbox_endpoints``); a
  *loopback* endpoint (``reaching``: a black-box agent's gateway) also answers on
  ``127.0.0.1:<port>`` inside, for programs that speak HTTP to a TCP address;
- the rlimits of ``SandboxLimits`` plus ``RLIMIT_NPROC``. A limit on processes holds only
  for an unprivileged user, so a worker running as root starts bubblewrap as
  ``sandbox_uid`` (nobody by default), which also makes the work directory that user's.
  A worker running as its own user (``dev up`` as root) keeps it: the kernel counts its
  own threads too, so the limit is that many tasks above what the user runs already.

``DockerSandbox`` (``execution_loop.sandbox_docker``) runs each command in a container of the
host's own system; a deployment wires it in where a Docker daemon is the isolation it has.

``default_sandbox()`` fails closed: bubblewrap where it works (checked once per process by
running ``true`` in it), else ``SandboxUnavailable`` naming Debian's ``bubblewrap`` package.
Agent code runs unisolated (the local backend, whose ``isolation`` says what it lacks) only
where that was said explicitly: by the stack (``TRILOOP_SANDBOX=local``, a development
setting shown by ``triloop dev status`` and the console) or by the contract
(``isolation.allow_unisolated``, used only where bubblewrap cannot run). The episode's
record carries ``describe(sandbox)``, with why it ran unisolated.
"""

from __future__ import annotations

import copy
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import replace
from functools import cache
from pathlib import Path

from execution_loop.sandbox import (
    LocalProcessSandbox,
    SandboxBackend,
    SandboxError,
    SandboxLimits,
    SandboxResult,
    _which_limit,
)
from execution_loop.sandbox_endpoints import (
    ENDPOINTS_DIR,
    EndpointRelay,
    loopback_argv,
    parse_endpoint,
)

NOBODY = 65534
_SYSTEM = ("/usr", "/etc")
_LINKS = (("usr/bin", "/bin"), ("usr/sbin", "/sbin"), ("usr/lib", "/lib"), ("usr/lib64", "/lib64"))


def python_installation() -> list[Path]:
    """Folders the worker's interpreter needs (the venv's and the base installation)."""
    folders = {Path(sys.prefix), Path(sys.base_prefix), Path(os.path.realpath(sys.executable))
               .parent.parent}
    return sorted(f for f in folders if not str(f).startswith(_SYSTEM))


def python_dependencies() -> list[Path]:
    """The installation plus every ``site-packages`` folder on this interpreter's path.

    What a command needs to import the worker's third-party packages (a verifier's pytest):
    a venv may chain another's packages through a ``.pth`` file. Never the project folder,
    which holds the worker's home and its secrets.
    """
    packages = {Path(entry) for entry in sys.path
                if Path(entry).name in ("site-packages", "dist-packages") and Path(entry).is_dir()}
    return sorted({*python_installation(), *packages})


class BubblewrapSandbox(LocalProcessSandbox):
    """Each command in fresh namespaces under bubblewrap, with the local backend's limits."""

    name = "bubblewrap"
    isolation = ("user, mount, pid, ipc, uts and network namespaces; read-only system; "
                 "private work directory; rlimits with a process count")

    def __init__(self, *, bwrap: str | None = None, sandbox_uid: int = NOBODY,
                 python: str | None = None, endpoints: Mapping[str, str] | None = None) -> None:
        super().__init__(python)
        self._endpoints = dict(endpoints or {})
        for value in self._endpoints.values():
            parse_endpoint(value)  # refuse a malformed endpoint now, not at the first command
        # Endpoints that also answer on 127.0.0.1:<port> inside (see ``reaching``).
        self._loopback: dict[str, str] = {}
        self._relay_dir: Path | None = None  # the running command's relay folder
        self._one_at_a_time = threading.Lock()  # _wrap reads the running command's folder
        found = bwrap or shutil.which("bwrap")
        if found is None:
            raise FileNotFoundError("bwrap is not installed (Debian: apt-get install bubblewrap)")
        self._bwrap = found
        self._uid = sandbox_uid if os.geteuid() == 0 else -1

    def _identity(self, limits: SandboxLimits) -> tuple[int, int]:
        if self._uid >= 0:
            return limits.max_processes, self._uid
        # Not root (the worker runs as its own OS user): the command keeps that user, and
        # the kernel counts every task of it against RLIMIT_NPROC, the worker's own threads
        # included. The limit is then that many tasks more than the user already runs.
        return limits.max_processes + tasks_of(os.getuid()), -1

    def reaching(self, loopback: Mapping[str, str]) -> BubblewrapSandbox:
        """A copy whose commands also reach these host addresses (``name: "127.0.0.1:port"``)
        on the same address inside, and nothing else new.

        The copy has its own relay folder and lock, so copies run side by side.
        """
        for value in loopback.values():
            host, _ = parse_endpoint(value)
            if host not in ("127.0.0.1", "localhost"):
                raise ValueError(f"a loopback endpoint must be on 127.0.0.1, got {value!r}")
        clone = copy.copy(self)
        clone._loopback = {**self._loopback, **loopback}
        clone._relay_dir = None
        clone._one_at_a_time = threading.Lock()
        return clone

    def run(
        self,
        argv: Sequence[str],
        *,
        limits: SandboxLimits,
        workdir: Path | None = None,
        stdin: str = "",
        extra_env: Mapping[str, str] | None = None,
        expose: Sequence[Path] = (),
    ) -> SandboxResult:
        """As the local backend; a command killed by a signal reads as such again.

        With named endpoints, a relay listens for this command only (see
        ``sandbox_endpoints``); the sandbox finds each socket in its variable.
        """
        with self._one_at_a_time:
            return self._run_with_endpoints(argv, limits, workdir, stdin, extra_env, expose)

    def _run_with_endpoints(
        self,
        argv: Sequence[str],
        limits: SandboxLimits,
        workdir: Path | None,
        stdin: str,
        extra_env: Mapping[str, str] | None,
        expose: Sequence[Path],
    ) -> SandboxResult:
        relay: EndpointRelay | None = None
        folder: Path | None = None
        if self._endpoints or self._loopback:
            folder = Path(tempfile.mkdtemp(prefix="triloop-endpoints-"))
            if self._uid >= 0:
                os.chown(folder, self._uid, self._uid)
            relay = EndpointRelay(folder, {**self._endpoints, **self._loopback}, self._uid)
            extra_env = {**(extra_env or {}), **relay.variables}
        self._relay_dir = folder
        try:
            result = super().run(argv, limits=limits, workdir=workdir, stdin=stdin,
                                 extra_env=extra_env, expose=expose)
        finally:
            self._relay_dir = None
            if relay is not None:
                relay.close()
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
        # bwrap exits with 128 + the signal that killed the command; report -signal.
        if 128 < result.exit_code <= 128 + 64:
            code = 128 - result.exit_code
            limit = result.limit_exceeded or _which_limit(
                code, result.timed_out, 0.0, limits, result.stderr)
            return replace(result, exit_code=code, limit_exceeded=limit)
        return result

    def _wrap(
        self,
        argv: list[str],
        workdir: Path,
        limits: SandboxLimits,
        expose: Sequence[Path],
    ) -> list[str]:
        del limits
        if self._uid >= 0:
            _give(workdir, self._uid)

        binds: list[str] = []
        for system in _SYSTEM:
            binds += ["--ro-bind", system, system]
        for target, link in _LINKS:
            if Path(link).is_symlink():
                binds += ["--symlink", target, link]
            elif Path(link).is_dir():
                binds += ["--ro-bind", link, link]
        for folder in [*python_installation(), *expose]:
            binds += ["--ro-bind-try", str(folder), str(folder)]
        # bwrap runs as the sandbox user, who must be able to reach the work directory:
        # folders made by tempfile.mkdtemp() under /tmp are (their parent is world-searchable).
        if self._relay_dir is not None:
            binds += ["--bind", str(self._relay_dir), ENDPOINTS_DIR]
        if self._loopback:  # the forwarder listens first, then becomes the command
            ports = {name: parse_endpoint(value)[1] for name, value in self._loopback.items()}
            argv = loopback_argv(self._python, ports, argv)
        work = str(workdir.resolve())
        return [
            self._bwrap, "--unshare-all", "--die-with-parent", "--new-session",
            "--cap-drop", "ALL", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", *binds,
            "--bind", work, work, "--remount-ro", "/", "--chdir", work, "--", *argv,
        ]


def tasks_of(uid: int) -> int:
    """How many tasks (threads of every process) the user runs now, as RLIMIT_NPROC counts.

    Read from ``/proc`` with the standard library: verifiers import this module inside the
    sandbox, where only the interpreter is.
    """
    count = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            status = Path(entry.path, "status").read_text()
        except OSError:  # gone meanwhile
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if int(fields["Uid"].split()[0]) == uid:
            count += int(fields["Threads"])
    return count


def _give(folder: Path, uid: int) -> None:
    """Make the work directory the sandbox user's, so the command can write only there."""
    for root, dirs, files in os.walk(folder):
        for name in [*dirs, *files]:
            os.lchown(os.path.join(root, name), uid, uid)
    os.chown(folder, uid, uid)


@cache
def bubblewrap_problem() -> str | None:
    """None when bubblewrap can run a command here; otherwise why it cannot."""
    try:
        sandbox = BubblewrapSandbox()
    except FileNotFoundError as exc:
        return str(exc)
    result = sandbox.run(["true"], limits=SandboxLimits(cpu_time_s=5, wall_time_s=20.0))
    if result.exit_code != 0:
        return f"bwrap cannot create namespaces here: {result.stderr.strip()[:300]}"
    return None


class SandboxUnavailable(SandboxError):
    """Agent code would run unisolated, and nothing said it may: fail closed.

    Infrastructure (retried, so a worker where bubblewrap runs may take the episode); the
    admission probe turns it into a refusal.
    """


def stack_setting() -> str:
    """The stack's ``TRILOOP_SANDBOX`` (``bubblewrap``, the default, or ``local``), validated."""
    from triloop.config import Settings

    return Settings().sandbox


def default_sandbox(
    endpoints: Mapping[str, str] | None = None, *, allow_unisolated: bool = False
) -> SandboxBackend:
    """Bubblewrap where it works; unisolated only where the stack or the contract says so.

    ``endpoints``: the contract's named network endpoints, the only ones reachable.
    ``allow_unisolated``: the contract's ``isolation.allow_unisolated``. Raises
    ``SandboxUnavailable`` naming the package when bubblewrap cannot run and neither allows it.
    """
    if stack_setting() == "local":
        return LocalProcessSandbox(why="TRILOOP_SANDBOX=local: the stack's development setting")
    problem = bubblewrap_problem()
    if problem is None:
        return BubblewrapSandbox(endpoints=endpoints)
    if allow_unisolated:
        return LocalProcessSandbox(why=f"{problem}; the contract allows unisolated agent code"
                                       " (isolation.allow_unisolated)")
    raise SandboxUnavailable(
        f"agent code runs only in the bubblewrap sandbox, and it cannot run here: {problem}."
        " Install Debian's package bubblewrap (apt-get install bubblewrap; scripts/bootstrap.sh"
        " does it as root) where user namespaces work, or, for development only, set"
        " TRILOOP_SANDBOX=local or the contract's isolation.allow_unisolated to run it"
        " unisolated")


def reaching_loopback(sandbox: SandboxBackend, loopback: Mapping[str, str]) -> SandboxBackend:
    """The sandbox for a program that must reach these worker addresses (and no others).

    Bubblewrap: a copy that relays them (see ``BubblewrapSandbox.reaching``). The local
    backend has the host's network already. Docker's ``--network none`` has no relay: a
    program there reaches nothing, which its record shows as a failed episode.
    """
    if isinstance(sandbox, BubblewrapSandbox):
        return sandbox.reaching(loopback)
    return sandbox


def describe(sandbox: SandboxBackend) -> dict[str, str]:
    """What an episode's record says about the sandbox it ran in."""
    described = {"backend": sandbox.name,
                 "isolation": str(getattr(sandbox, "isolation", "unknown"))}
    if sandbox.name == "local":
        described["why"] = str(getattr(sandbox, "why", None) or "the caller chose it")
    return described


def describe_environment_sandbox(env: object) -> dict[str, str]:
    """The record of where an environment ran agent code (none for text-only ones)."""
    backend = getattr(env, "sandbox_backend", None)
    if backend is None:
        return {"backend": "none", "isolation": "the environment runs no agent code"}
    return describe(backend)
