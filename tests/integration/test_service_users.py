"""Issue 32, route 9: one service's process cannot read another service's secrets.

The real ``dev up`` (every service, workers and web included) in a temporary home on free
ports. As root it runs each service as its own OS user; the attack is made as the learning
worker's user, with exactly its groups, against the files and process environments of the
other services and the stack's signing keys.
"""

from __future__ import annotations

import json
import os
import pwd
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from triloop.config import Settings
from triloop.devstack import accounts
from triloop.devstack.processes import free_port, recorded_process
from triloop.devstack.stack import SERVICE_ORDER, StackPaths, down, up, users_line

pytestmark = [pytest.mark.integration, pytest.mark.slow]
needs_root = pytest.mark.skipif(
    os.geteuid() != 0,
    reason="dev up makes per-service OS users only when run as root (as any other user "
    "every service shares that user, and `dev status` says so)")
# Secrets the invoking shell holds: no service may inherit them.
SHELL_OPA_TOKEN = "operator-shell-opa-token-not-for-services"
SHELL_PG_PASSWORD = "operator-shell-pg-password-not-for-services"
PYTHON_SERVICES = {"governance-worker": "governance", "execution-worker": "execution",
                   "learning-worker": "learning", "web": "web", "verifier": "verifier"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    """The whole stack up (as root: one user per service), down at the end."""
    if os.geteuid() != 0:
        pytest.skip("dev up makes per-service OS users only when run as root")
    home = tmp_path_factory.mktemp("service-users") / "home"
    # As `triloop dev up` is run: the services read the same TRILOOP_* settings.
    variables = {"TRILOOP_HOME": str(home), "TRILOOP_PG_PORT": str(free_port()),
                 "TRILOOP_TEMPORAL_ADDRESS": f"127.0.0.1:{free_port()}",
                 "TRILOOP_TEMPORAL_UI_PORT": str(free_port()),
                 "TRILOOP_OPA_URL": f"http://127.0.0.1:{free_port()}",
                 "TRILOOP_WEB_PORT": str(free_port()),
                 "TRILOOP_OPA_TOKEN": SHELL_OPA_TOKEN, "PGPASSWORD": SHELL_PG_PASSWORD}
    with pytest.MonkeyPatch.context() as patch:
        for name, value in variables.items():
            patch.setenv(name, value)
        settings = Settings()
        try:
            up(settings)
            yield settings
        finally:
            down(settings)
    left = [p.pid for p in psutil.process_iter(["username"])
            if str(p.info["username"]).startswith(accounts.USER_PREFIX)
            and str(home) in " ".join(_cmdline(p))]
    assert left == [], "dev down left service processes running"


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.Error:
        return []


def _pid(settings: Settings, name: str) -> int:
    proc = recorded_process(StackPaths(settings.home.resolve()).pid_file(name))
    assert proc is not None, f"{name} is not running"
    return proc.pid


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def _groups(pid: int) -> set[int]:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Groups:"):
            return {int(g) for g in line.split()[1:]}
    raise AssertionError(f"no Groups line for {pid}")


def _secrets_folder(settings: Settings, service: str) -> Path:
    return StackPaths(settings.home.resolve()).home / "services" / service / "secrets"


@needs_root
def test_each_service_runs_as_its_own_os_user(stack: Settings) -> None:
    uids = {}
    for name in SERVICE_ORDER:
        proc = psutil.Process(_pid(stack, name))
        expected = pwd.getpwnam(accounts.user_name(name))
        assert proc.uids().real == proc.uids().effective == expected.pw_uid, name
        assert proc.gids().real == expected.pw_gid, name
        # No group of root's; only the shared groups the service needs.
        shared = {accounts.shared_gid(group) for group, members in
                  accounts.SHARED_GROUPS.items() if name in members}
        assert _groups(proc.pid) == shared, name
        assert pwd.getpwuid(expected.pw_uid).pw_shell == accounts.NO_LOGIN
        uids[name] = expected.pw_uid
    assert len(set(uids.values())) == len(SERVICE_ORDER), uids
    assert "each service runs as its own OS user" in users_line()


@needs_root
def test_each_secrets_folder_and_log_is_its_services_alone(stack: Settings) -> None:
    for name, service in {**PYTHON_SERVICES, "opa": "opa"}.items():
        uid = pwd.getpwnam(accounts.user_name(name)).pw_uid
        folder = _secrets_folder(stack, service)
        if name in PYTHON_SERVICES:
            assert Path(_environ(_pid(stack, name))["TRILOOP_SECRETS_DIR"]) == folder
        info = folder.stat()
        assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (uid, 0o700), folder
        files = list(folder.iterdir())
        assert files, folder
        for file in files:
            assert (file.stat().st_uid, stat.S_IMODE(file.stat().st_mode)) == (uid, 0o600), file
    # The verifier asks no policy and drives no workflow: its database password is all it has.
    assert [p.name for p in _secrets_folder(stack, "verifier").iterdir()] == ["pg-verifier"]
    for name in SERVICE_ORDER:
        log = stack.home.resolve() / "logs" / f"{name}.log"
        uid = pwd.getpwnam(accounts.user_name(name)).pw_uid
        assert (log.stat().st_uid, stat.S_IMODE(log.stat().st_mode)) == (uid, 0o600), log


# Run as the learning worker's user: which of these paths can it open for reading?
PROBE = """
import json, sys
readable = []
for path in json.loads(sys.argv[1]):
    try:
        with open(path, "rb") as handle:
            handle.read(1)
        readable.append(path)
    except OSError:
        pass
print(json.dumps(readable))
"""


def _readable_as(pid: int, paths: list[str]) -> list[str]:
    """The paths a process with ``pid``'s uid, gid and groups can read."""
    proc = psutil.Process(pid)
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(paths)], capture_output=True, text=True,
        check=True, cwd="/", env={"PATH": "/usr/bin:/bin"}, user=proc.uids().real,
        group=proc.gids().real, extra_groups=sorted(_groups(pid)))
    readable: list[str] = json.loads(done.stdout)
    return readable


@needs_root
def test_the_learning_worker_cannot_read_other_services_secrets(stack: Settings) -> None:
    home = stack.home.resolve()
    learning = _pid(stack, "learning-worker")
    # Each other service's secrets folder, where its own process says it is.
    folders = [Path(_environ(_pid(stack, name))["TRILOOP_SECRETS_DIR"])
               for name in ("governance-worker", "web", "execution-worker", "verifier")]
    folders += [folder for folder in [_secrets_folder(stack, "opa")] if folder.is_dir()]
    others = [str(p) for folder in folders for p in folder.iterdir()]
    keys = [str(home / "secrets" / name) for name in (
        "temporal-signing-key", "opa-bundle-signing-key", "session_secret", "pg-owner",
        "temporal-admin", "pg-governance", "temporal-web")]
    environs = [f"/proc/{_pid(stack, name)}/environ" for name in SERVICE_ORDER
                if name != "learning-worker"]
    server_state = [str(p) for p in (home / "temporal").iterdir() if p.is_file()]
    attempts = others + keys + environs + server_state
    assert len(others) >= 10 and server_state
    assert _readable_as(learning, attempts) == []
    # Its own secrets and environment it does read: the refusals are about whose they are.
    own = [str(p) for p in Path(_environ(learning)["TRILOOP_SECRETS_DIR"]).iterdir()]
    assert sorted(_readable_as(learning, [*own, f"/proc/{learning}/environ"])) == sorted(
        [*own, f"/proc/{learning}/environ"])


@needs_root
def test_no_service_environment_holds_another_services_secret(stack: Settings) -> None:
    home = stack.home.resolve()
    every = {p.name: p.read_text().strip() for p in (home / "secrets").iterdir() if p.is_file()}
    for name in SERVICE_ORDER:
        environ = _environ(_pid(stack, name))
        values = "\0".join(environ.values())
        own = {p.name for p in _secrets_folder(stack, PYTHON_SERVICES[name]).iterdir()
               } if name in PYTHON_SERVICES else set()
        leaked = [secret for secret, value in every.items()
                  if secret not in own and len(value) >= 16 and value in values]
        if name == "web":  # the console's session secret is the web service's own
            leaked = [secret for secret in leaked if secret != "session_secret"]
        assert leaked == [], name
        assert SHELL_OPA_TOKEN not in values and SHELL_PG_PASSWORD not in values, name


def test_not_root_every_service_shares_the_invoking_user(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a laptop (not root) nothing changes user, and `dev status` says so."""
    monkeypatch.setattr(accounts.os, "geteuid", lambda: 1000)
    assert accounts.ensure_account("learning-worker") is None
    assert "shared: every service runs as" in users_line()


def test_handing_out_secrets_never_writes_through_a_link_the_service_planted(
    tmp_path: Path,
) -> None:
    """The service owns its folder; a link it made there must not redirect root's write."""
    from triloop.secrets import ensure_secret, hand_out

    operator = tmp_path / "secrets"
    value = ensure_secret(operator, "pg-learning")
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    folder = tmp_path / "services" / "learning" / "secrets"
    folder.mkdir(parents=True)
    (folder / "pg-learning").symlink_to(victim)
    (folder / "planted").symlink_to(victim)
    hand_out(operator, folder, ["pg-learning"])
    assert victim.read_text() == "untouched"
    assert not (folder / "pg-learning").is_symlink()
    assert (folder / "pg-learning").read_text() == value
    assert {p.name for p in folder.iterdir()} == {"pg-learning"}
