"""``DockerSandbox``: each command in a throwaway container of the host's own system.

For a deployment whose isolation is a Docker daemon (Debian's ``docker.io``) rather than
user namespaces. No image is pulled: ``HOST_IMAGE`` is imported once from a tiny archive of
empty folders and the ``/bin``, ``/lib`` links, and each container binds the host's
``/usr``, ``/etc`` and the Python installation read-only, as bubblewrap does. Each command:

- no network (``--network none``), a read-only root, a private ``/tmp``;
- the work directory (a fresh one when none is given) bound at its own path, the only
  place it may write; ``expose`` adds read-only folders;
- an unprivileged user (``nobody`` when the worker is root, else the worker's user), all
  capabilities dropped, no new privileges;
- the limits of ``SandboxLimits`` as the container's: ``--memory`` (a cgroup limit, so the
  kernel's OOM killer ends it: read back from ``docker inspect``), ``--pids-limit``, and
  ``--ulimit`` for CPU seconds, file size and open files. The docker client itself runs
  under the local backend's wall clock and output limits; a container that outlives its
  wall clock is removed with ``docker rm -f``.

It has no relay for named endpoints or the gateway (``sandboxes.reaching_loopback``), and
``default_sandbox()`` never picks it: a worker's wiring passes it where wanted.
"""

from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
import tarfile
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from execution_loop.sandbox import (
    DEFAULT_PATH,
    LocalProcessSandbox,
    SandboxError,
    SandboxLimits,
    SandboxResult,
    _which_limit,
    check_command,
)
from execution_loop.sandboxes import NOBODY, _give, python_installation

HOST_IMAGE = "triloop-host-system:1"
_FOLDERS = ("usr", "etc", "tmp", "proc", "dev", "sys", "run")
_LINKS = (("bin", "usr/bin"), ("sbin", "usr/sbin"), ("lib", "usr/lib"), ("lib64", "usr/lib64"))
_SYSTEM = ("/usr", "/etc")
# The docker client is a Go program that reserves far more address space than it uses; the
# command's memory limit is the container's (--memory), not the client's.
_CLIENT_MEMORY = 16 * 2**30
_DOCKER_FAILED = 125  # docker run's own failure (the daemon refused), not the command's


def host_image_archive() -> bytes:
    """The image's only content: empty mount points and the merged-/usr links."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name in _FOLDERS:
            folder = tarfile.TarInfo(name)
            folder.type, folder.mode = tarfile.DIRTYPE, 0o755
            archive.addfile(folder)
        for name, target in _LINKS:
            link = tarfile.TarInfo(name)
            link.type, link.linkname = tarfile.SYMTYPE, target
            archive.addfile(link)
    return buffer.getvalue()


class DockerSandbox:
    """A command in a throwaway container, under the limits of ``SandboxLimits``."""

    name = "docker"
    isolation = ("container: no network, read-only root, unprivileged user, pids, memory and"
                 " CPU limits, private work directory")

    def __init__(self, *, docker: str | None = None, host: str | None = None,
                 sandbox_uid: int = NOBODY, python: str | None = None) -> None:
        found = docker or shutil.which("docker")
        if found is None:
            raise FileNotFoundError("the docker client is not installed (Debian: apt-get"
                                    " install docker.io)")
        self._docker = found
        # The client runs with a clean environment, so the daemon's address is an argument.
        self._host = host or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        self._uid = sandbox_uid if os.geteuid() == 0 else os.getuid()
        self._client = LocalProcessSandbox(python)
        self._image_ready = False

    def _call(self, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run([self._docker, "-H", self._host, *args], input=stdin,
                              capture_output=True, timeout=120, check=False)

    def ensure_image(self) -> None:
        """Import ``HOST_IMAGE`` unless the daemon has it; ``SandboxError`` if it cannot."""
        if self._image_ready:
            return
        if self._call("image", "inspect", HOST_IMAGE).returncode != 0:
            made = self._call("import", "-", HOST_IMAGE, stdin=host_image_archive())
            if made.returncode != 0:
                raise SandboxError(f"docker cannot import {HOST_IMAGE}: "
                                   f"{made.stderr.decode(errors='replace').strip()[:300]}")
        self._image_ready = True

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
        """Run ``argv`` in a container and report how it ended; limits never raise."""
        check_command(argv, workdir)
        self.ensure_image()
        folder = workdir or Path(tempfile.mkdtemp(prefix="triloop-docker-"))
        container = f"triloop-{uuid.uuid4().hex[:16]}"
        try:
            if os.geteuid() == 0:
                _give(folder, self._uid)
            command = self._command(list(argv), container, folder, limits, extra_env, expose)
            client_limits = replace(limits, memory_bytes=_CLIENT_MEMORY)
            result = self._client.run(command, limits=client_limits, workdir=folder,
                                      stdin=stdin)
            return self._ended(result, container, limits)
        finally:
            self._call("rm", "-f", container)  # gone already unless it outlived the client
            if workdir is None:
                shutil.rmtree(folder, ignore_errors=True)

    def _command(self, argv: list[str], container: str, workdir: Path, limits: SandboxLimits,
                 extra_env: Mapping[str, str] | None, expose: Sequence[Path]) -> list[str]:
        work = str(workdir.resolve())
        mounts: list[str] = []
        for folder in [*_SYSTEM, *map(str, python_installation()), *map(str, expose)]:
            if Path(folder).exists():
                mounts += ["--mount", f"type=bind,src={folder},dst={folder},readonly"]
        mounts += ["--mount", f"type=bind,src={work},dst={work}"]
        variables = {"PATH": DEFAULT_PATH, "HOME": work, "LANG": "C.UTF-8", **(extra_env or {})}
        environment = [part for key, value in sorted(variables.items())
                       for part in ("-e", f"{key}={value}")]
        cpu, size, files = limits.cpu_time_s, limits.max_file_bytes, limits.max_open_files
        return [
            self._docker, "-H", self._host, "run", "-i", "--name", container,
            "--network", "none", "--read-only", "--tmpfs", "/tmp",
            "--user", f"{self._uid}:{self._uid}", "--cap-drop", "ALL",
            "--security-opt", "no-new-privileges", "--pids-limit", str(limits.max_processes),
            "--memory", str(limits.memory_bytes), "--memory-swap", str(limits.memory_bytes),
            "--ulimit", f"cpu={cpu}:{cpu + 1}", "--ulimit", f"fsize={size}:{size}",
            "--ulimit", f"nofile={files}:{files}", "--ulimit", "core=0:0",
            *mounts, "-w", work, *environment, HOST_IMAGE, *argv,
        ]

    def _ended(self, result: SandboxResult, container: str,
               limits: SandboxLimits) -> SandboxResult:
        """The container's ending as the command's: 128+N is signal N, OOM is memory."""
        if result.timed_out:
            return result
        if result.exit_code == _DOCKER_FAILED and "Error response from daemon" in result.stderr:
            raise SandboxError(f"docker could not run the command: {result.stderr[-500:]}")
        if not 128 < result.exit_code <= 128 + 64:
            return result
        code = 128 - result.exit_code
        state = self._call("inspect", "--format", "{{.State.OOMKilled}}", container)
        if state.stdout.decode().strip() == "true":
            limit: str | None = "memory"
        elif code == -signal.SIGKILL:  # the hard CPU limit (the soft one sends SIGXCPU)
            limit = "cpu_time"
        else:
            limit = _which_limit(code, False, 0.0, limits, result.stderr)
        return replace(result, exit_code=code, limit_exceeded=limit)
