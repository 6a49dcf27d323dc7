"""The console's session secret: one per install, kept with the other generated secrets.

``triloop dev up`` asks for it once per install (``triloop.secrets``: folder 0700, file
0600, refused when others may read it) and hands it to the web process only, in its
environment; no other service sees it.
"""

from __future__ import annotations

from pathlib import Path

from triloop.secrets import SecretFileError, ensure_secret

SESSION_SECRET_FILE = "session_secret"

__all__ = ["SESSION_SECRET_FILE", "SecretFileError", "ensure_session_secret"]


def ensure_session_secret(home: Path) -> str:
    """The install's session secret, generated on first use."""
    value = ensure_secret(home / "secrets", SESSION_SECRET_FILE)
    if len(value) < 32:
        raise SecretFileError(f"{home / 'secrets' / SESSION_SECRET_FILE} holds fewer than 32"
                              " characters; delete it to regenerate")
    return value
