"""One OS user per service of the dev stack, so no service can read another's secrets.

Run as root, ``dev up`` starts every service (PostgreSQL, Temporal, OPA, each loop's
worker, the web app) under its own system user, ``triloop-<service>``, made on first use
(``useradd --system``: no login shell, no home; each gets ``HOME`` in the stack's state
folder instead). Its secrets folder is its own (0700, files 0600), its log file is its
own, and ``/proc/<pid>/environ`` of its processes is readable by it alone: the kernel lets
only the same uid (or root) read another process's environment.

Nothing is shared but what a service must share, each through one group given to the
processes that need it and no other (``SHARED_GROUPS``; no other supplementary group):
the artifact store (learning writes checkpoints, execution and governance read them) and
the game-day faults file (web writes, execution reads).

What a service user must reach outside the state folder (the interpreter, the cached
dependencies, the checkout, the OPA and Temporal binaries, typically under ``/root``,
0700) is granted by ``grant_traverse``: search permission (``o+x``) on each parent folder
that lacks it, never read: nobody may list ``/root``, only follow a path they already know.

Not root (a developer's laptop): every service runs as the invoking user, as before, and
``dev status`` says so. Adding a service is one line in ``stack.SERVICE_ORDER``; if it
shares a folder, one more in ``SHARED_GROUPS``.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

USER_PREFIX = "triloop-"
NO_LOGIN = "/usr/sbin/nologin"
# A group per shared folder, and the stack processes given it.
ARTIFACTS_GROUP = "triloop-artifacts"
FAULTS_GROUP = "triloop-faults"
SHARED_GROUPS: dict[str, tuple[str, ...]] = {
    ARTIFACTS_GROUP: ("learning-worker", "execution-worker", "governance-worker"),
    FAULTS_GROUP: ("web", "execution-worker"),
}
_LOCKED_EXIT = (1, 10)  # useradd/groupadd: /etc/passwd or /etc/group locked by another one
_ATTEMPTS = 20


class AccountError(RuntimeError):
    """A service user or group could not be made; the message names the command."""


@dataclass(frozen=True)
class ServiceAccount:
    """The OS identity one stack process runs as: its user, its group, shared groups."""

    service: str
    user: str
    uid: int
    gid: int
    groups: tuple[int, ...] = ()
    # Extra capabilities the process keeps (ambient), e.g. net_bind_service for a port
    # below 1024; none by default.
    capabilities: tuple[str, ...] = ()


def separate_users() -> bool:
    """Whether ``dev up`` runs each service as its own user: only root can switch users."""
    return os.geteuid() == 0


def user_name(service: str) -> str:
    """``triloop-<service>``: the stack process name without ``-worker``."""
    return USER_PREFIX + service.removesuffix("-worker")


def ensure_account(service: str) -> ServiceAccount | None:
    """The service's account, made if missing; None when not root (everyone shares one)."""
    if not separate_users():
        return None
    name = user_name(service)
    entry = _ensure_user(name, service)
    groups = tuple(_ensure_group(group) for group, members in sorted(SHARED_GROUPS.items())
                   if service in members)
    return ServiceAccount(service=service, user=name, uid=entry.pw_uid, gid=entry.pw_gid,
                          groups=groups)


def shared_gid(group: str) -> int:
    """The gid of a shared group, made if missing."""
    return _ensure_group(group)


def _ensure_user(name: str, service: str) -> pwd.struct_passwd:
    command = ["useradd", "--system", "--user-group", "--no-create-home", "--home-dir",
               "/nonexistent", "--shell", NO_LOGIN, "--comment", f"triloop {service}", name]
    _run_until_made(command, lambda: _lookup_user(name) is not None)
    entry = _lookup_user(name)
    assert entry is not None
    return entry


def _ensure_group(name: str) -> int:
    _run_until_made(["groupadd", "--system", name], lambda: _lookup_group(name) is not None)
    return grp.getgrnam(name).gr_gid


def _run_until_made(command: list[str], exists: Callable[[], bool]) -> None:
    """Run useradd/groupadd until the account exists; another ``dev up`` may race us."""
    stderr = ""
    for _ in range(_ATTEMPTS):
        if exists():
            return
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode == 0 or exists():
            return
        stderr = done.stderr.strip()
        if done.returncode not in _LOCKED_EXIT:
            break
    raise AccountError(f"`{' '.join(command)}` failed: {stderr}; "
                       "dev up must run as root to make service users")


def _lookup_user(name: str) -> pwd.struct_passwd | None:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        return None


def _lookup_group(name: str) -> grp.struct_group | None:
    try:
        return grp.getgrnam(name)
    except KeyError:
        return None


def grant_traverse(path: Path) -> None:
    """Let other users reach ``path``: ``o+x`` on each parent that lacks it, never ``o+r``."""
    for parent in Path(os.path.abspath(path)).parents:
        mode = parent.stat().st_mode
        if not mode & stat.S_IXOTH:
            os.chmod(parent, stat.S_IMODE(mode) | stat.S_IXOTH)


def own_folder(path: Path, account: ServiceAccount | None, mode: int = 0o700) -> Path:
    """A folder only ``account`` may use (the invoking user's when None), made if missing.

    Its parent must not be writable by the account: it could swap the folder for a link.
    """
    path.mkdir(mode=mode, parents=True, exist_ok=True)
    if account is not None:
        os.chown(path, account.uid, account.gid, follow_symlinks=False)
    os.chmod(path, mode, follow_symlinks=False)
    return path


def hand_over(path: Path, account: ServiceAccount) -> None:
    """Give a service everything under ``path`` (its state folder), top folder 0700.

    Links are changed themselves, never followed: a service cannot make root give it a
    file elsewhere by planting a link in its own folder.
    """
    for root, dirs, files in os.walk(path):
        for name in (*dirs, *files):
            os.chown(os.path.join(root, name), account.uid, account.gid, follow_symlinks=False)
    os.chown(path, account.uid, account.gid, follow_symlinks=False)
    os.chmod(path, 0o700)


def take_back(path: Path) -> None:
    """Make a service's state folder root's again, links removed, before root writes there.

    Its files (config, keys) are then written where the service cannot redirect them;
    ``hand_over`` gives the folder back when the service starts.
    """
    if not path.is_dir():
        return
    for root, dirs, files in os.walk(path):
        for name in (*dirs, *files):
            entry = os.path.join(root, name)
            if os.path.islink(entry):
                os.unlink(entry)  # the state of our services holds no links
            else:
                os.chown(entry, 0, 0)
    os.chown(path, 0, 0, follow_symlinks=False)


def shared_folder(path: Path, *, owner: ServiceAccount | None, group: str,
                  group_writes: bool = False) -> Path:
    """A folder its owner writes and the group's members read (or write), nobody else.

    setgid, so what is made inside belongs to the group too; its files are written with
    the usual ``0644``/``0755``, readable by the group because only the group may enter.
    """
    path.mkdir(parents=True, exist_ok=True)
    uid, gid = (owner.uid if owner is not None else 0), shared_gid(group)
    # What an earlier stack (run as one user) wrote there becomes the owner's too.
    for root, dirs, files in os.walk(path):
        for name in (*dirs, *files):
            os.chown(os.path.join(root, name), uid, gid, follow_symlinks=False)
    os.chown(path, uid, gid, follow_symlinks=False)
    os.chmod(path, stat.S_ISGID | (0o770 if group_writes else 0o750))
    return path


def running_as(uid: int) -> str:
    """The user name of a uid, for ``dev status``."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"
