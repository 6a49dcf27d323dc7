"""The local process sandbox: limits trip without raising, nothing leaks in or lingers."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from execution_loop.sandbox import LocalProcessSandbox, SandboxError, SandboxLimits

FAST = SandboxLimits(cpu_time_s=1, memory_bytes=256 * 2**20, wall_time_s=5.0)


@pytest.fixture
def sandbox() -> LocalProcessSandbox:
    return LocalProcessSandbox()


def python(code: str) -> list[str]:
    return [sys.executable, "-I", "-S", "-c", code]


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper counts as dead)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "State:\tZ" not in status


def test_runs_a_command_and_captures_its_output(sandbox: LocalProcessSandbox) -> None:
    result = sandbox.run(
        python("import sys; print('out'); print('err', file=sys.stderr)"), limits=FAST
    )
    assert (result.exit_code, result.stdout, result.stderr) == (0, "out\n", "err\n")
    assert result.limit_exceeded is None and not result.timed_out
    assert sandbox.run(["cat"], limits=FAST, stdin="hello").stdout == "hello"


def test_environment_is_clean(
    sandbox: LocalProcessSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRILOOP_SECRET_TOKEN", "hunter2")
    result = sandbox.run(["env"], limits=FAST)
    variables = dict(line.split("=", 1) for line in result.stdout.splitlines())
    assert set(variables) == {"PATH", "HOME", "LANG"}
    assert "hunter2" not in result.stdout
    assert Path(variables["HOME"]).name.startswith("triloop-sandbox-")  # the fresh folder


def test_fresh_working_folder_is_home_and_removed(sandbox: LocalProcessSandbox) -> None:
    result = sandbox.run(
        python("import os; print(os.getcwd()); print(os.listdir('.'))"), limits=FAST
    )
    cwd, listing = result.stdout.splitlines()
    assert listing == "[]"
    assert not Path(cwd).exists()


def test_given_working_folder_is_used_and_kept(
    sandbox: LocalProcessSandbox, tmp_path: Path
) -> None:
    sandbox.run(python("open('made.txt', 'w').write('x')"), limits=FAST, workdir=tmp_path)
    assert (tmp_path / "made.txt").read_text() == "x"
    with pytest.raises(SandboxError, match="does not exist"):
        sandbox.run(["true"], limits=FAST, workdir=tmp_path / "missing")


def test_memory_bomb_is_a_limit_not_an_exception(sandbox: LocalProcessSandbox) -> None:
    result = sandbox.run(python("x = bytearray(4 * 1024**3)"), limits=FAST)
    assert result.limit_exceeded == "memory" and result.exit_code != 0
    growing = sandbox.run(python("a = []\nwhile True: a.append(' ' * 10**6)"), limits=FAST)
    assert growing.limit_exceeded == "memory"


def test_infinite_loop_hits_the_cpu_limit(sandbox: LocalProcessSandbox) -> None:
    result = sandbox.run(python("while True: pass"), limits=FAST)
    assert result.limit_exceeded == "cpu_time" and not result.timed_out


def test_sleeping_past_the_wall_clock_is_killed(sandbox: LocalProcessSandbox) -> None:
    limits = SandboxLimits(wall_time_s=0.5)
    result = sandbox.run(["sleep", "30"], limits=limits)
    assert result.timed_out and result.limit_exceeded == "wall_time"
    assert result.exit_code < 0  # killed by a signal: `sleep 30` never exited on its own


def test_children_are_killed_with_the_command(sandbox: LocalProcessSandbox) -> None:
    # A background child that outlives a command which exits normally...
    result = sandbox.run(["sh", "-c", "sleep 60 & echo $!"], limits=FAST)
    assert result.exit_code == 0
    orphan = int(result.stdout)
    # ...and a tree of children still running when the wall clock runs out.
    script = "import os, subprocess\nfor _ in range(3): print(subprocess.Popen(['sleep', '60']).pid, flush=True)\nos.system('sleep 60')"  # noqa: E501
    tree = sandbox.run(python(script), limits=SandboxLimits(wall_time_s=1.0))
    assert tree.timed_out
    children = [int(pid) for pid in tree.stdout.split()]
    assert len(children) == 3
    time.sleep(0.2)
    assert not any(alive(pid) for pid in [orphan, *children])


def test_output_is_bounded_keeping_head_and_tail(sandbox: LocalProcessSandbox) -> None:
    limits = SandboxLimits(max_output_bytes=100)
    result = sandbox.run(python("print('START' + 'x' * 1_000_000 + 'END')"), limits=limits)
    assert result.output_truncated
    assert result.stdout.startswith("START") and result.stdout.rstrip().endswith("END")
    assert len(result.stdout) < 200 and "bytes truncated" in result.stdout


def test_file_size_limit(sandbox: LocalProcessSandbox) -> None:
    limits = SandboxLimits(max_file_bytes=1024)
    result = sandbox.run(python("open('big', 'wb').write(b'x' * 10**6)"), limits=limits)
    assert result.limit_exceeded == "file_size"


def test_missing_command_is_an_exit_code(sandbox: LocalProcessSandbox) -> None:
    result = sandbox.run(["no-such-command-anywhere"], limits=FAST)
    assert result.exit_code == 127 and "cannot start" in result.stderr
    with pytest.raises(SandboxError):
        sandbox.run([], limits=FAST)


def test_unread_input_does_not_block(sandbox: LocalProcessSandbox) -> None:
    result = sandbox.run(["true"], limits=FAST, stdin="x" * 1_000_000)
    assert result.exit_code == 0 and not result.timed_out


def test_runs_concurrently_from_threads(sandbox: LocalProcessSandbox) -> None:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda i: sandbox.run(["echo", str(i)], limits=FAST), range(8)))
    assert [r.stdout.strip() for r in results] == [str(i) for i in range(8)]
