"""Generated credentials of the embedded stack: one file per secret, mode 0600, folder 0700.

``triloop dev up`` (and the test fixtures) generate every credential once per install under
``$TRILOOP_HOME/secrets/``: the PostgreSQL owner's password (``pg-owner``), one password
per service role (``pg-<service>``), one OPA bearer token per service (``opa-<service>``)
and the web service's session secret. Each service process is then handed a folder of its
own, ``services/<service>/secrets/`` under the stack's home, holding only its own
credentials (``TRILOOP_SECRETS_DIR``), so a worker cannot log in as another loop's role or
query OPA as another service. Run as root, ``dev up`` makes that folder the service's OS
user's and this one root's alone (``triloop.devstack.accounts``). In production the same
file names come from a secret store mounted per service, or each credential is passed
explicitly (see the README).
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Iterable
from pathlib import Path

OWNER_PASSWORD = "pg-owner"
# The bearer token a Prometheus scrape of /metrics sends (triloop/metrics.py); optional.
METRICS_TOKEN = "metrics-token"


class SecretFileError(RuntimeError):
    """A secret file that cannot be trusted or read; the message says how to fix it."""


def role_password_name(service: str) -> str:
    """File name of a service role's PostgreSQL password."""
    return f"pg-{service}"


def opa_token_name(service: str) -> str:
    """File name of a service's OPA bearer token."""
    return f"opa-{service}"


def temporal_token_name(holder: str) -> str:
    """File name of a service's (or the operator's) Temporal token, a signed JWT."""
    return f"temporal-{holder}"


def read_secret(directory: Path, name: str) -> str | None:
    """The secret's value, or None when the folder holds no such secret.

    A file others may read is refused: the secret may already be known to them.
    """
    path = directory / name
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return None
    if mode & 0o077:
        raise SecretFileError(
            f"{path} has mode {mode:04o}: other users may have read it. Delete it (`dev up`"
            " generates a new one) or `chmod 600` it if you are sure nobody else could read it.")
    return path.read_text().strip() or None


def write_secret(directory: Path, name: str, value: str) -> None:
    """Write one secret readable by its owner only (the folder is made 0700)."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    path = directory / name
    # Created 0600 before the value is written: never readable by others, not even briefly.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(value)
    os.chmod(path, 0o600)


def ensure_secret(directory: Path, name: str) -> str:
    """The secret's value, generated (256 random bits) the first time it is asked for.

    Two processes asking at once get the same value: the new file is written privately
    and linked into place, so one wins and the other reads the winner's.
    """
    existing = read_secret(directory, name)
    if existing is not None:
        return existing
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    temporary = directory / f".{name}.{os.getpid()}.tmp"
    write_secret(directory, temporary.name, secrets.token_urlsafe(32))
    try:
        os.link(temporary, directory / name)
    except FileExistsError:
        pass
    finally:
        temporary.unlink(missing_ok=True)
    value = read_secret(directory, name)
    if value is None:
        raise SecretFileError(f"{directory / name} is empty; delete it to generate a new one")
    return value


def hand_out(directory: Path, folder: Path, names: Iterable[str], *,
             owner: tuple[int, int] | None = None) -> Path:
    """Copy the named secrets into one service's own ``folder``; it holds those only.

    ``owner`` (uid, gid): the service's OS user, who then owns the folder (0700) and its
    files (0600). Each file is written new and renamed into place, never opened through
    a name the service could have made a link: the folder is the service's to change.
    """
    wanted = list(names)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    if owner is not None:
        os.chown(folder, *owner, follow_symlinks=False)
    os.chmod(folder, 0o700, follow_symlinks=False)
    for stale in folder.iterdir():
        if stale.name not in wanted:
            stale.unlink()  # a link or an older credential: nothing the service should keep
    for name in wanted:
        value = read_secret(directory, name)
        if value is None:
            raise FileNotFoundError(f"secret {name!r} is missing from {directory}")
        replace_file(folder / name, value, owner=owner)
    return folder


def replace_file(path: Path, text: str, *, owner: tuple[int, int] | None = None,
                 mode: int = 0o600) -> None:
    """Write ``path`` anew and rename it into place: never through a link planted there.

    For root writing into a folder a service owns (its secrets, its state): opening the
    old name could follow a link the service made to any file on the host.
    """
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as handle:
        if owner is not None:
            os.fchown(fd, *owner)
        os.fchmod(fd, mode)
        handle.write(text)
    os.replace(temporary, path)
