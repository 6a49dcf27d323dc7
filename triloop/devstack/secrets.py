"""Per-install secrets of the embedded stack, kept under ``<home>/secrets`` (0700, files 0600).

``triloop dev up`` generates the console's session secret once per install and
hands it to the web process only (in its environment); no other service sees it.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

SESSION_SECRET_FILE = "session_secret"


class SecretFileError(RuntimeError):
    """A secret file that cannot be trusted or read; the message says how to fix it."""


def secrets_dir(home: Path) -> Path:
    """``<home>/secrets``, created owner-only (0700) and tightened if it exists."""
    folder = home / "secrets"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    return folder


def ensure_session_secret(home: Path) -> str:
    """The install's session secret, generated on first use into a 0600 file."""
    path = secrets_dir(home) / SESSION_SECRET_FILE
    if not path.exists():
        _create(path, secrets.token_urlsafe(48))
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise SecretFileError(
            f"{path} has mode {mode:04o}: other users may have read it. Delete it (dev up "
            "generates a new one and every console session ends) or `chmod 600` it if you "
            "are sure nobody else could read it."
        )
    value = path.read_text(encoding="ascii").strip()
    if len(value) < 32:
        raise SecretFileError(f"{path} holds fewer than 32 characters; delete it to regenerate")
    return value


def _create(path: Path, value: str) -> None:
    # Write a private temporary file and link it into place: a concurrent `dev up`
    # either wins the link or reads the winner's secret, never a half-written file.
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(descriptor, "w", encoding="ascii") as handle:
            handle.write(value + "\n")
        try:
            os.link(temporary, path)
        except FileExistsError:
            pass
    finally:
        temporary.unlink(missing_ok=True)
