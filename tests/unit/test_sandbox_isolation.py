"""Agent code under the bubblewrap backend: no network, no writes or reads outside its work
directory, no host processes, a bounded process count. Skipped, with the reason, only where
bubblewrap cannot run (``scripts/bootstrap.sh`` installs it)."""

from __future__ import annotations

import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from execution_loop.environments.registry import load_builtin_contract, make_environment
from execution_loop.sandbox import LocalProcessSandbox, SandboxLimits
from execution_loop.sandboxes import (
    BubblewrapSandbox,
    bubblewrap_problem,
    default_sandbox,
    describe,
    describe_environment_sandbox,
)

ROOT = Path(__file__).resolve().parents[2]
LIMITS = SandboxLimits(cpu_time_s=5, memory_bytes=512 * 2**20, wall_time_s=20.0)
needs_bwrap = pytest.mark.skipif(bubblewrap_problem() is not None,
                                 reason=f"bubblewrap cannot run here: {bubblewrap_problem()}")


@pytest.fixture
def sandbox() -> BubblewrapSandbox:
    return BubblewrapSandbox()


def run_python(sandbox: BubblewrapSandbox, code: str, workdir: Path | None = None,
               limits: SandboxLimits = LIMITS) -> tuple[int, str, str]:
    result = sandbox.run([sys.executable, "-I", "-S", "-c", code], limits=limits,
                         workdir=workdir)
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def host_server() -> Iterator[int]:
    """A TCP server on the host's loopback that counts connections."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.5)
    accepted: list[object] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    server.close()
    assert accepted == [], "the sandbox reached a host service"


@needs_bwrap
def test_agent_code_has_no_network(sandbox: BubblewrapSandbox, host_server: int) -> None:
    code, out, _ = run_python(sandbox, f"""
import socket
for address in [("127.0.0.1", {host_server}), ("10.0.0.1", 80), ("1.1.1.1", 53)]:
    try:
        socket.create_connection(address, timeout=2)
        print("connected", address)
    except OSError as exc:
        print("refused", exc.errno)
print(sorted(line.split(":")[0].strip() for line in open("/proc/net/dev").readlines()[2:]))
""")
    assert code == 0 and "connected" not in out
    assert out.splitlines()[-1] == "['lo']"  # no interface but its own loopback


@needs_bwrap
def test_agent_code_writes_only_its_work_directory(
    sandbox: BubblewrapSandbox, tmp_path: Path
) -> None:
    work = Path(tempfile.mkdtemp(prefix="triloop-test-work-"))  # reachable by the sandbox user
    outside = Path(tempfile.mkdtemp(prefix="triloop-test-outside-")) / "outside.txt"
    scratch = Path("/tmp") / f"triloop-scratch-{os.getpid()}-{work.name}"
    code, out, err = run_python(sandbox, f"""
for path in ["/usr/evil", "/etc/evil", {str(outside)!r}, {str(ROOT / "evil")!r},
             {str(Path(sys.prefix) / "evil")!r}]:
    try:
        open(path, "w").write("x")
        print("wrote", path)
    except OSError as exc:
        print("refused", path, exc.errno)
open({str(scratch)!r}, "w").write("private")
open("mine.txt", "w").write("ok")
print("done")
""", workdir=work)
    assert code == 0 and out.endswith("done\n"), (out, err)
    # A checkout under /tmp (a CI clone) sits in the sandbox's own /tmp: a write there lands
    # in that private tmpfs (bwrap makes the parents of read-only binds in it), never on the
    # host. Anywhere else, the write is refused.
    wrote = [line.split()[1] for line in out.splitlines() if line.startswith("wrote ")]
    assert all(path.startswith("/tmp/") for path in wrote), (out, err)
    assert (work / "mine.txt").read_text() == "ok"
    assert not outside.exists() and not (ROOT / "evil").exists()
    assert not any(Path(path).exists() for path in wrote)
    assert not scratch.exists()  # its /tmp was its own
    shutil.rmtree(work)
    shutil.rmtree(outside.parent)


@needs_bwrap
def test_agent_code_cannot_read_the_verifiers_files(sandbox: BubblewrapSandbox) -> None:
    verifier = ROOT / "execution_loop" / "environments" / "tool_arithmetic.py"
    secrets = ROOT / ".triloop" / "secrets"
    code, out, _ = run_python(sandbox, f"""
import os
for path in [{str(verifier)!r}, {str(secrets)!r}, "/root/.cache"]:
    try:
        size = len(os.listdir(path)) if os.path.isdir(path) else len(open(path).read())
        print("read", path, size)
    except OSError as exc:
        print("hidden", path, exc.errno)
print(sorted(os.listdir({str(ROOT)!r})))
""")
    *lines, listing = out.splitlines()
    assert code == 0 and all(line.startswith("hidden") for line in lines), out
    # Only the interpreter's folder (when the venv lives in the checkout) is mounted there.
    assert set(eval(listing)) <= {".venv"}


@needs_bwrap
def test_agent_code_sees_no_host_process(sandbox: BubblewrapSandbox) -> None:
    code, out, _ = run_python(sandbox, """
import os
print(sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
""")
    pids = eval(out)  # a list of ints printed by the sandbox
    assert code == 0 and os.getpid() not in pids and len(pids) <= 3


@needs_bwrap
def test_a_fork_bomb_is_bounded_and_leaves_nothing(sandbox: BubblewrapSandbox) -> None:
    limits = SandboxLimits(cpu_time_s=5, memory_bytes=512 * 2**20, wall_time_s=10.0,
                           max_processes=16)
    code, out, _ = run_python(sandbox, """
import os, time
born = 0
while born < 10_000:
    try:
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        born += 1
    except OSError:
        break
print("forks", born)
""", limits=limits)
    assert code == 0
    born = int(out.split()[-1])
    assert born < 16  # RLIMIT_NPROC refused the rest
    # The PID namespace goes with the command; the kernel reaps its members just after.
    for _ in range(100):
        leftover = [p for p in os.listdir("/proc") if p.isdigit() and _uid_of(p) == 65534
                    and "os.fork()" in _cmdline(p)]
        if not leftover:
            break
        time.sleep(0.1)
    assert leftover == []


def _uid_of(pid: str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except FileNotFoundError:
        return None


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text()
    except OSError:
        return ""


@needs_bwrap
def test_environments_and_their_verifiers_run_under_bubblewrap(tmp_path: Path) -> None:
    del tmp_path
    assert default_sandbox().name == "bubblewrap"
    assert describe(default_sandbox())["backend"] == "bubblewrap"
    env = make_environment(load_builtin_contract("tool_arithmetic"), sandbox=BubblewrapSandbox())
    env.reset(3)
    result = env.step("python: import os; print(sum(p.isdigit() for p in os.listdir('/proc')) < 4)")
    assert "True" in result.observation
    env.step("answer: 0")
    assert env.outcome().details["reason"] == "wrong_answer"  # the verifier ran, in bwrap too


def test_the_local_backend_says_it_does_not_isolate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRILOOP_SANDBOX", "local")
    chosen = default_sandbox()
    assert isinstance(chosen, LocalProcessSandbox) and chosen.name == "local"
    record = describe(chosen)
    assert record["isolation"].startswith("none:") and record["why"]


def test_each_environment_says_where_agent_code_ran() -> None:
    lake = make_environment(load_builtin_contract("frozen_lake"))
    assert describe_environment_sandbox(lake) == {
        "backend": "none", "isolation": "the environment runs no agent code"}
    local = make_environment(load_builtin_contract("tool_arithmetic"),
                             sandbox=LocalProcessSandbox())
    assert describe_environment_sandbox(local)["backend"] == "local"

@needs_bwrap
def test_the_default_for_an_environment_running_agent_code_is_bubblewrap() -> None:
    arithmetic = make_environment(load_builtin_contract("tool_arithmetic"))
    assert describe_environment_sandbox(arithmetic)["backend"] == "bubblewrap"


@needs_bwrap
def test_a_named_endpoint_is_the_only_address_reachable() -> None:
    """The host's HTTP server is reachable through its named socket; nothing else is."""
    import http.server

    class Hello(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"hello from the allowed endpoint")

        def log_message(self, *args: object) -> None:
            del args

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        sandbox = BubblewrapSandbox(endpoints={"gateway": f"127.0.0.1:{port}"})
        code, out, err = run_python(sandbox, f"""
import os, socket
path = os.environ["TRILOOP_ENDPOINT_GATEWAY"]
unix = socket.socket(socket.AF_UNIX)
unix.connect(path)
unix.sendall(b"GET / HTTP/1.0\\r\\n\\r\\n")
reply = b""
while chunk := unix.recv(4096):
    reply += chunk
print(reply.decode().splitlines()[-1])
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=2)
    print("direct: connected")
except OSError:
    print("direct: refused")
""")
    finally:
        server.shutdown()
    assert code == 0, err
    assert out.splitlines() == ["hello from the allowed endpoint", "direct: refused"]


def test_contracts_name_endpoints_and_others_keep_their_identity() -> None:
    from pydantic import ValidationError

    from triloop.contracts import EnvironmentContract, canonical_form

    base = load_builtin_contract("tool_arithmetic")
    assert b'"network"' not in canonical_form(base, {})
    data = base.model_dump(mode="json")
    allowed = EnvironmentContract.model_validate(
        {**data, "network": {"endpoints": {"gateway": "127.0.0.1:8000"}}})
    assert b'"network"' in canonical_form(allowed, {})
    with pytest.raises(ValidationError, match="expected 'host:port'"):
        EnvironmentContract.model_validate(
            {**data, "network": {"endpoints": {"gateway": "anywhere"}}})
