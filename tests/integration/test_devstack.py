"""``dev up`` then ``dev down`` starts each service and leaves no process behind."""

from __future__ import annotations

from pathlib import Path

import jwt
import psutil
import pytest

from triloop.config import Settings
from triloop.devstack.processes import ServiceStartError, free_port
from triloop.devstack.stack import down, status, up

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _settings(home: Path) -> Settings:
    temporal = free_port()
    return Settings(
        home=home,
        pg_port=free_port(),
        temporal_address=f"127.0.0.1:{temporal}",
        temporal_ui_port=free_port(),
        opa_url=f"http://127.0.0.1:{free_port()}",
        web_port=free_port(),
    )


def _descendants_alive(pids: list[int]) -> list[int]:
    return [pid for pid in pids if psutil.pid_exists(pid)
            and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]


def test_up_then_down_leaves_no_process(tmp_path: Path) -> None:
    settings = _settings(tmp_path / "home")
    try:
        lines = up(settings, with_workers=False)
        assert any("Temporal" in line for line in lines)
        running = {name: state for name, state, _ in status(settings)}
        for name in ("postgres", "temporal", "opa"):
            assert running[name].startswith("running"), running
        pids: list[int] = []
        # The real server, with authorization: status says so (the dev server says it isn't).
        assert "JWT authorization on" in running["temporal"]
        for name in ("postgres", "temporal", "opa"):
            pid = int(running[name].split("pid ")[1].split(")")[0])
            pids.append(pid)
            pids += [child.pid for child in psutil.Process(pid).children(recursive=True)]
        # Every credential is generated once, readable by its owner only.
        secrets = settings.home / "secrets"
        assert oct(secrets.stat().st_mode & 0o777) == "0o700"
        files = [p for p in secrets.iterdir() if p.is_file()]
        assert files and all(oct(p.stat().st_mode & 0o777) == "0o600" for p in files)
        # A second `up` starts nothing new.
        up(settings, with_workers=False)
        assert {n: s for n, s, _ in status(settings)} == running
    finally:
        stopped = down(settings)
    assert set(stopped) >= {"postgres", "temporal", "opa"}
    assert _descendants_alive(pids) == []
    assert all(state == "stopped" for _, state, _ in status(settings))


def test_port_taken_by_another_program_is_named(tmp_path: Path) -> None:
    import socket

    settings = _settings(tmp_path / "home")
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", settings.pg_port))
        blocker.listen()
        with pytest.raises(ServiceStartError) as caught:
            up(settings, with_workers=False)
    message = str(caught.value)
    assert "postgres" in message and str(settings.pg_port) in message
    assert "postgres.log" in message
    down(settings)


def test_each_service_is_handed_its_own_credentials_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from triloop.devstack.stack import ensure_credentials, service_env

    settings = _settings(tmp_path / "home")
    monkeypatch.setenv("TRILOOP_DATABASE_URL", "postgresql+psycopg://postgres:owner@h/db")
    ensure_credentials(settings)
    for service in ("execution", "learning", "governance", "web"):
        env = service_env(settings, service)  # type: ignore[arg-type]
        assert "TRILOOP_DATABASE_URL" not in env  # services never hold the owner's URL
        from sqlalchemy.engine import make_url

        role_url = make_url(env[f"TRILOOP_DATABASE_URL_{service.upper()}"])
        assert (role_url.username, role_url.password) == (f"triloop_{service}", None)
        folder = Path(env["TRILOOP_SECRETS_DIR"])
        assert {p.name for p in folder.iterdir()} == {
            f"pg-{service}", f"opa-{service}", f"temporal-{service}"}
        # The Temporal token writes in the service's own loop's namespace, nowhere else.
        claims = jwt.decode((folder / f"temporal-{service}").read_text(),
                            options={"verify_signature": False})
        expected = [f"triloop-{loop}:write" for loop in ("execution", "learning", "governance")
                    if service in (loop, "web")]
        assert claims["permissions"] == expected
        assert ("TRILOOP_SESSION_SECRET" in env) == (service == "web")
        assert oct(folder.stat().st_mode & 0o777) == "0o700"
    # The verifier holds its own database password and nothing else.
    env = service_env(settings, "verifier")
    assert make_url(env["TRILOOP_DATABASE_URL_VERIFIER"]).username == "triloop_verifier"
    assert {p.name for p in Path(env["TRILOOP_SECRETS_DIR"]).iterdir()} == {"pg-verifier"}
    assert "TRILOOP_SESSION_SECRET" not in env


def test_status_says_plainly_when_temporal_authenticates_nobody(tmp_path: Path) -> None:
    from triloop.devstack.stack import temporal_mode_line

    quick = temporal_mode_line(_settings(tmp_path).model_copy(update={"temporal_mode": "dev"}),
                               "127.0.0.1")
    assert "UNAUTHENTICATED" in quick
    assert "JWT authorization on" in temporal_mode_line(_settings(tmp_path), "127.0.0.1")
