"""Start the reference environment service for a test, and write its contract."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from triloop.devstack.processes import free_port as devstack_free_port

ROOT = Path(__file__).resolve().parents[1]
SERVICE_DIR = ROOT / "examples" / "letter-count-service"
SERVER = SERVICE_DIR / "letter_service.py"
OPENENV_SERVER = ROOT / "examples" / "openenv-countdown" / "countdown_server.py"


def free_port() -> int:
    """A loopback port nobody listens on now (outside the ephemeral range)."""
    return devstack_free_port()


@contextmanager
def reference_service() -> Iterator[str]:
    """The reference server as its own process; yields its base URL."""
    with _served(SERVER, "/info") as url:
        yield url


@contextmanager
def openenv_server() -> Iterator[str]:
    """The OpenEnv countdown example, served by openenv-core's own helpers; its base URL."""
    with _served(OPENENV_SERVER, "/health", wait_s=120.0) as url:
        yield url


@contextmanager
def _served(script: Path, probe: str, wait_s: float = 30.0) -> Iterator[str]:
    port = free_port()
    process = subprocess.Popen([sys.executable, str(script), "--port", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + wait_s  # openenv-core's import alone takes seconds
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"{script.name} exited: {process.stderr!r}")
            try:
                httpx.get(f"{url}{probe}", timeout=1.0).raise_for_status()
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)


def write_contract(into: Path, url: str, *, digest: str | None = None,
                   replace: tuple[str, str] | None = None) -> Path:
    """The served contract for ``url`` (pinning the server's own digest unless told)."""
    text = (SERVICE_DIR / "contract.template.yaml").read_text()
    pinned = digest or hashlib.sha256(SERVER.read_bytes()).hexdigest()
    text = text.replace("{url}", url).replace("{verifier_digest}", pinned)
    if replace:
        text = text.replace(*replace)
    path = into / "letter_count_service.yaml"
    path.write_text(text)
    return path


def write_openenv_contract(into: Path, url: str, *, digest: str | None = None) -> Path:
    """The shipped openenv contract pointed at ``url``, pinning that server's schema."""
    from execution_loop.environments import openenv as openenv_env
    from execution_loop.environments import registry

    text = (registry.CONTRACTS_DIR / "openenv.yaml").read_text()
    text = text.replace("http://127.0.0.1:8011", url)
    text = text.replace("0" * 64, digest or openenv_env.schema_digest(url))
    path = into / "openenv.yaml"
    path.write_text(text)
    return path
