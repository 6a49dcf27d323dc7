"""The web service refuses a public session secret; `dev up` makes one per install."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from triloop.config import DEV_SESSION_SECRET, Settings
from triloop.devstack.secrets import SecretFileError, ensure_session_secret
from triloop.devstack.servers import repo_root
from triloop.devstack.stack import ensure_credentials, service_env
from web.app import InsecureConfiguration, create_app


@pytest.mark.parametrize("profile", ["production", "demo"])
def test_web_refuses_the_built_in_secret_outside_tests(profile: str) -> None:
    with pytest.raises(InsecureConfiguration, match="TRILOOP_SESSION_SECRET"):
        create_app(Settings(gate_profile=profile))  # type: ignore[arg-type]
    with pytest.raises(InsecureConfiguration, match="only 5 characters"):
        create_app(Settings(gate_profile=profile, session_secret="short"))  # type: ignore[arg-type]
    app = create_app(Settings(gate_profile=profile, session_secret="s" * 40))  # type: ignore[arg-type]
    assert app.state.services.signer is not None


def test_test_profile_accepts_the_built_in_secret() -> None:
    assert Settings().session_secret == DEV_SESSION_SECRET
    create_app(Settings(gate_profile="test"))


def test_uvicorn_entry_point_refuses_to_start_and_names_the_variable() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRILOOP_")}
    env["TRILOOP_GATE_PROFILE"] = "production"
    done = subprocess.run([sys.executable, "-c", "import web.app; web.app.app"],
                          cwd=repo_root(), env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "TRILOOP_SESSION_SECRET" in done.stderr and "built-in session secret" in done.stderr


def test_dev_up_generates_one_private_secret_per_install(tmp_path: Path) -> None:
    home = tmp_path / ".triloop"
    first = ensure_session_secret(home)
    assert len(first) >= 32 and first != DEV_SESSION_SECRET
    assert ensure_session_secret(home) == first  # stable: sessions survive a restart
    file = home / "secrets" / "session_secret"
    assert stat.S_IMODE(file.stat().st_mode) == 0o600
    assert stat.S_IMODE(file.parent.stat().st_mode) == 0o700
    assert ensure_session_secret(tmp_path / "other") != first  # one per install
    file.chmod(0o644)
    with pytest.raises(SecretFileError, match="0644"):
        ensure_session_secret(home)


def test_only_the_web_process_gets_the_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TRILOOP_SESSION_SECRET", raising=False)
    settings = Settings(home=tmp_path / ".triloop")
    ensure_credentials(settings)  # what `dev up` does before it starts any service
    web = service_env(settings, "web")
    assert web["TRILOOP_SESSION_SECRET"] == ensure_session_secret(tmp_path / ".triloop")
    # An operator's own secret (here from the shell) wins, and still reaches web only.
    monkeypatch.setenv("TRILOOP_SESSION_SECRET", "x" * 40)
    chosen = Settings(home=tmp_path / ".triloop")
    assert service_env(chosen, "web")["TRILOOP_SESSION_SECRET"] == "x" * 40
    for service in ("execution", "learning", "governance"):
        assert "TRILOOP_SESSION_SECRET" not in service_env(chosen, service)
