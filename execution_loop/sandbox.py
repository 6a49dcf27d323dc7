"""Run an untrusted command with CPU, memory, file-size and wall-clock limits.

``LocalProcessSandbox`` starts each command in its own session (so its whole process
group can be killed, children included) with a clean environment (PATH, HOME set to
the working folder, LANG: nothing inherited from the worker). Resource limits are set
by a tiny launcher that then execs the command, rather than by ``preexec_fn``, which is
unsafe in the threaded worker that runs activities. A limit that trips is reported in
``SandboxResult.limit_exceeded``; it never raises into the caller.

What it does not do: hide the filesystem or the network, limit the process count when
it runs as root, or stop a process that calls ``setsid`` to leave its group.
``execution_loop.sandboxes`` has the backends that isolate (bubblewrap, Docker) and
picks the default, which fails closed: this one runs agent code only where the stack or the
contract says so explicitly, and the episode's record says why.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
_OOM_MARKERS = ("MemoryError", "Cannot allocate memory", "std::bad_alloc", "out of memory")

# Runs as `python -I -S -B -c _LAUNCHER cpu mem fsize nofile nproc uid argv...`: sets the
# limits on itself (nproc 0: unset), drops to `uid` (-1: stays) and becomes the command.
_LAUNCHER = """
import os, resource as r, sys
def cap(res, soft, hard):
    old_hard = r.getrlimit(res)[1]
    if old_hard != r.RLIM_INFINITY:
        soft, hard = min(soft, old_hard), min(hard, old_hard)
    r.setrlimit(res, (soft, hard))
cpu, mem, fsize, nofile, nproc, uid = (int(v) for v in sys.argv[1:7])
cap(r.RLIMIT_CPU, cpu, cpu + 1)
cap(r.RLIMIT_AS, mem, mem)
cap(r.RLIMIT_FSIZE, fsize, fsize)
cap(r.RLIMIT_NOFILE, nofile, nofile)
cap(r.RLIMIT_CORE, 0, 0)
if nproc > 0:
    cap(r.RLIMIT_NPROC, nproc, nproc)
if uid >= 0:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
try:
    os.execvp(sys.argv[7], sys.argv[7:])
except OSError as exc:
    sys.stderr.write(f"sandbox: cannot start {sys.argv[7]!r}: {exc}\\n")
    os._exit(127)
"""


@dataclass(frozen=True)
class SandboxLimits:
    """Limits for one command."""

    cpu_time_s: int = 5  # CPU seconds (RLIMIT_CPU; SIGKILL one second later)
    memory_bytes: int = 512 * 2**20  # address space (RLIMIT_AS)
    wall_time_s: float = 10.0  # seconds before the process group is killed
    max_output_bytes: int = 64 * 1024  # per stream; the head and the tail are kept
    max_file_bytes: int = 64 * 2**20  # largest file it may write (RLIMIT_FSIZE)
    max_open_files: int = 256  # RLIMIT_NOFILE
    max_processes: int = 64  # RLIMIT_NPROC, where the backend enforces it (not as root)


@dataclass(frozen=True)
class SandboxResult:
    """How a sandboxed command ended."""

    exit_code: int  # negative: killed by that signal
    stdout: str
    stderr: str
    timed_out: bool
    limit_exceeded: str | None  # wall_time | cpu_time | memory | file_size
    wall_s: float
    output_truncated: bool = False


class SandboxError(RuntimeError):
    """The sandbox itself could not run (bad working folder, cannot fork): infrastructure."""


class SandboxBackend(Protocol):
    """Runs one command under limits; ``workdir=None`` means a fresh, removed folder.

    ``expose``: host folders the command may read beyond the system (a verifier's code);
    a backend that hides the filesystem binds them read-only, the local one sees all.
    """

    name: str  # "local" | "bubblewrap" | "docker", recorded with each episode

    def run(
        self,
        argv: Sequence[str],
        *,
        limits: SandboxLimits,
        workdir: Path | None = None,
        stdin: str = "",
        extra_env: Mapping[str, str] | None = None,
        expose: Sequence[Path] = (),
    ) -> SandboxResult: ...


class _Capture:
    """Keeps the first and last ``limit/2`` bytes of a stream and counts the rest."""

    def __init__(self, limit: int) -> None:
        self.head_room = limit - limit // 2
        self.tail_room = limit // 2
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.head_room - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        self.tail += chunk
        if len(self.tail) > self.tail_room:
            del self.tail[: len(self.tail) - self.tail_room]

    def text(self) -> tuple[str, bool]:
        dropped = self.total - len(self.head) - len(self.tail)
        head = self.head.decode("utf-8", "replace")
        tail = self.tail.decode("utf-8", "replace")
        if dropped <= 0:
            return head + tail, False
        return f"{head}\n[... {dropped} bytes truncated ...]\n{tail}", True


def _drain(stream: IO[bytes], capture: _Capture) -> None:
    fd = stream.fileno()
    while chunk := os.read(fd, 65536):
        capture.feed(chunk)


def _feed(stream: IO[bytes], data: bytes) -> None:
    try:
        stream.write(data)
    except OSError:
        pass  # the command exited without reading its input
    finally:
        try:
            stream.close()
        except OSError:
            pass  # flushing into a closed pipe: same thing


def _wait_without_reaping(pid: int, exited: threading.Event) -> None:
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    except ChildProcessError:
        pass  # reported by the reaping wait4 that follows
    exited.set()


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # nothing left in the group


def clean_environment(workdir: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The only variables a sandboxed command sees."""
    return {"PATH": DEFAULT_PATH, "HOME": str(workdir), "LANG": "C.UTF-8", **(extra or {})}


def check_command(argv: Sequence[str], workdir: Path | None) -> None:
    """Refuse what no backend can run: an empty command, a working folder that is missing."""
    if not argv:
        raise SandboxError("no command given")
    if workdir is not None and not workdir.is_dir():
        raise SandboxError(f"working folder {workdir} does not exist")


class LocalProcessSandbox:
    """A process per command, in its own process group, under rlimits."""

    name = "local"
    isolation = "none: rlimits and a process group only"

    def __init__(self, python: str | None = None, *, why: str | None = None) -> None:
        self._python = python or sys.executable
        self.why = why  # why agent code runs unisolated here (the episode's record says it)

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
        """Run ``argv`` and report how it ended; limits never raise."""
        check_command(argv, workdir)
        folder = workdir or Path(tempfile.mkdtemp(prefix="triloop-sandbox-"))
        try:
            command = self._wrap(list(argv), folder, limits, expose)
            return self._run(command, folder, limits, stdin, extra_env)
        finally:
            if workdir is None:
                shutil.rmtree(folder, ignore_errors=True)

    def _wrap(
        self,
        argv: list[str],
        workdir: Path,
        limits: SandboxLimits,
        expose: Sequence[Path],
    ) -> list[str]:
        """The command as started (a backend that isolates puts its wrapper in front)."""
        del workdir, limits, expose
        return argv

    def _identity(self, limits: SandboxLimits) -> tuple[int, int]:
        """(RLIMIT_NPROC, uid to drop to): none here; the local backend changes no user."""
        del limits
        return 0, -1

    def _run(
        self,
        argv: list[str],
        workdir: Path,
        limits: SandboxLimits,
        stdin: str,
        extra_env: Mapping[str, str] | None,
    ) -> SandboxResult:
        nproc, uid = self._identity(limits)
        numbers = (limits.cpu_time_s, limits.memory_bytes, limits.max_file_bytes,
                   limits.max_open_files, nproc, uid)
        launcher = [self._python, "-I", "-S", "-B", "-c", _LAUNCHER]
        command = [*launcher, *map(str, numbers), *argv]
        started = time.monotonic()
        try:
            proc = subprocess.Popen(
                command,
                cwd=workdir,
                env=clean_environment(workdir, extra_env),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # own session and process group, killed as one
                close_fds=True,
            )
        except OSError as exc:
            raise SandboxError(f"cannot start a sandboxed process: {exc}") from exc
        if proc.stdin is None or proc.stdout is None or proc.stderr is None:
            raise SandboxError("sandboxed process has no pipes")
        out, err = _Capture(limits.max_output_bytes), _Capture(limits.max_output_bytes)
        threads = [
            threading.Thread(target=_drain, args=(proc.stdout, out), daemon=True),
            threading.Thread(target=_drain, args=(proc.stderr, err), daemon=True),
            threading.Thread(target=_feed, args=(proc.stdin, stdin.encode()), daemon=True),
        ]
        exited = threading.Event()
        # Wait without reaping: while the leader is a zombie its pid (= the group id)
        # cannot be reused, so killing the group afterwards can never hit a stranger.
        waiter = threading.Thread(target=_wait_without_reaping, args=(proc.pid, exited))
        for thread in [*threads, waiter]:
            thread.start()
        timed_out = not exited.wait(limits.wall_time_s)
        _kill_group(proc.pid)  # the command's leftovers (background children) go too
        waiter.join()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except ChildProcessError as exc:
            raise SandboxError(f"sandboxed process {proc.pid} was reaped elsewhere") from exc
        proc.returncode = exit_code = os.waitstatus_to_exitcode(status)
        for thread in threads:
            thread.join(timeout=2.0)  # a process that left the group may hold a pipe
        for stream, reader in zip((proc.stdout, proc.stderr), threads, strict=False):
            if not reader.is_alive():  # closing under a blocked read could recycle its fd
                stream.close()
        stdout, cut_out = out.text()
        stderr, cut_err = err.text()
        cpu_s = usage.ru_utime + usage.ru_stime
        return SandboxResult(
            exit_code=exit_code,
            stdout=stdout,
            stderr=stderr,
            timed_out=timed_out,
            limit_exceeded=_which_limit(exit_code, timed_out, cpu_s, limits, stderr),
            wall_s=round(time.monotonic() - started, 3),
            output_truncated=cut_out or cut_err,
        )


def _which_limit(
    exit_code: int, timed_out: bool, cpu_s: float, limits: SandboxLimits, stderr: str
) -> str | None:
    if timed_out:
        return "wall_time"
    killed_by = -exit_code if exit_code < 0 else None
    if killed_by == signal.SIGXCPU or (
        killed_by == signal.SIGKILL and cpu_s >= limits.cpu_time_s - 0.05
    ):
        return "cpu_time"
    # Python ignores SIGXFSZ, so an oversized write shows up as EFBIG on stderr instead.
    if killed_by == signal.SIGXFSZ or (exit_code != 0 and "File too large" in stderr):
        return "file_size"
    # RLIMIT_AS makes allocation fail inside the program, which reports it on stderr;
    # an unexplained SIGKILL is the kernel's OOM killer.
    if exit_code != 0 and (killed_by == signal.SIGKILL or any(m in stderr for m in _OOM_MARKERS)):
        return "memory"
    return None
