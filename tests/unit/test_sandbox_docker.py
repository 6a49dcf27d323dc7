"""The Docker backend against Docker's own daemon (Debian's ``docker.io``, which
``scripts/bootstrap.sh`` installs as root): isolation and limits as the bubblewrap tests check
them. A daemon that answers is used; else, as root, the fixture starts a private one (its own
socket, data and exec folders) and stops it after. Skipped, with the reason, only where
neither can be had."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from execution_loop.sandbox import SandboxError, SandboxLimits
from execution_loop.sandbox_docker import HOST_IMAGE, DockerSandbox

LIMITS = SandboxLimits(cpu_time_s=5, memory_bytes=256 * 2**20, wall_time_s=30.0)
DEFAULT_HOST = "unix:///var/run/docker.sock"


def _answers(client: str, host: str) -> bool:
    try:
        done = subprocess.run([client, "-H", host, "info", "--format", "{{.ServerVersion}}"],
                              capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _private_daemon(client: str) -> Iterator[str]:
    """A dockerd of the test's own (root only): socket, data and exec folders in /tmp."""
    folder = Path(tempfile.mkdtemp(prefix="tdk-"))  # short: the exec root holds sockets
    host = f"unix://{folder}/docker.sock"
    log = (folder / "dockerd.log").open("wb")
    daemon = subprocess.Popen(
        [shutil.which("dockerd") or "dockerd", "--host", host,
         "--data-root", str(folder / "data"), "--exec-root", str(folder / "exec"),
         "--pidfile", str(folder / "docker.pid"), "--iptables=false", "--ip6tables=false",
         "--bridge=none"], stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(120):
            if daemon.poll() is not None or _answers(client, host):
                break
            time.sleep(0.5)
        if not _answers(client, host):
            log.flush()
            tail = (folder / "dockerd.log").read_text(errors="replace")[-500:]
            pytest.skip(f"a private dockerd did not start here: {tail}")
        yield host
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(30)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        log.close()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def docker_host() -> Iterator[str]:
    """The address of a Docker daemon that answers."""
    client = shutil.which("docker")
    if client is None:
        pytest.skip("Docker backend not exercised: the docker client is not installed"
                    " (Debian: apt-get install docker.io; scripts/bootstrap.sh as root)")
    host = os.environ.get("DOCKER_HOST") or DEFAULT_HOST
    if _answers(client, host):
        yield host
        return
    if os.geteuid() != 0 or shutil.which("dockerd") is None:
        pytest.skip(f"Docker backend not exercised: no daemon answers at {host}, and"
                    " starting one needs root and dockerd")
    yield from _private_daemon(client)


@pytest.fixture
def docker(docker_host: str) -> DockerSandbox:
    return DockerSandbox(host=docker_host)


def run_python(sandbox: DockerSandbox, code: str, workdir: Path | None = None,
               limits: SandboxLimits = LIMITS, stdin: str = "") -> tuple[int, str, str]:
    result = sandbox.run([sys.executable, "-I", "-S", "-c", code], limits=limits,
                         workdir=workdir, stdin=stdin)
    return result.exit_code, result.stdout, result.stderr


def test_a_command_runs_in_a_container_of_the_host_system(
    docker: DockerSandbox, tmp_path: Path
) -> None:
    code = ("import os, sys; print(sys.stdin.read(), os.getcwd() == os.environ['HOME'],"
            " os.path.exists('/.dockerenv')); open('made', 'w').write('x')")
    exit_code, out, err = run_python(docker, code, workdir=tmp_path, stdin="task")
    assert exit_code == 0, err
    assert out.split() == ["task", "True", "True"]
    assert (tmp_path / "made").read_text() == "x"  # the work directory is the host's folder
    shown = subprocess.run(["docker", "-H", docker._host, "image", "inspect", HOST_IMAGE],
                           capture_output=True, check=False)
    assert shown.returncode == 0  # imported from the host's system, nothing pulled


def test_agent_code_has_no_network_and_no_host_files(docker: DockerSandbox) -> None:
    code = ("import os, socket\n"
            "try:\n    socket.create_connection(('127.0.0.1', 22), 2); print('reached')\n"
            "except OSError: print('no network')\n"
            f"print(os.path.exists({str(Path(__file__).resolve())!r}))\n"
            "try:\n    open('/usr/escape', 'w'); print('wrote')\n"
            "except OSError: print('read-only')\n")
    exit_code, out, err = run_python(docker, code)
    assert exit_code == 0, err
    assert out.split("\n")[:3] == ["no network", "False", "read-only"]


def test_memory_and_cpu_limits_are_reported_as_such(docker: DockerSandbox) -> None:
    memory = docker.run([sys.executable, "-c", "x = bytearray(1024 * 2**20); print(len(x))"],
                        limits=LIMITS)
    assert memory.exit_code != 0 and memory.limit_exceeded == "memory"
    busy = docker.run([sys.executable, "-c", "while True: pass"],
                      limits=SandboxLimits(cpu_time_s=1, wall_time_s=30.0))
    assert busy.exit_code < 0 and busy.limit_exceeded == "cpu_time"


def test_the_wall_clock_ends_the_container_too(docker: DockerSandbox) -> None:
    result = docker.run([sys.executable, "-c", "import time; time.sleep(60)"],
                        limits=SandboxLimits(wall_time_s=3.0))
    assert result.timed_out and result.limit_exceeded == "wall_time"
    left = subprocess.run(["docker", "-H", docker._host, "ps", "-q", "--filter",
                           "name=triloop-"], capture_output=True, text=True, check=False)
    assert left.stdout.strip() == ""  # removed, not left running behind the killed client


def test_a_fork_bomb_is_bounded(docker: DockerSandbox) -> None:
    code = ("import os\ncount = 0\n"
            "try:\n    while count < 500:\n        if os.fork() == 0:\n"
            "            import time; time.sleep(5); os._exit(0)\n        count += 1\n"
            "except OSError: pass\nprint(count)")
    exit_code, out, err = run_python(docker, code, limits=SandboxLimits(
        max_processes=16, wall_time_s=30.0))
    assert exit_code == 0, err
    assert int(out.strip()) < 16


def test_an_unreachable_daemon_is_a_sandbox_error(tmp_path: Path) -> None:
    if shutil.which("docker") is None:
        pytest.skip("the docker client is not installed")
    nowhere = DockerSandbox(host=f"unix://{tmp_path}/none.sock")
    with pytest.raises(SandboxError, match="docker cannot import"):
        nowhere.run(["true"], limits=LIMITS)
