"""Credentials: hashed API tokens, the signed console session cookie, and CSRF tokens.

API clients send ``Authorization: Bearer <token>``; only ``sha256(token)`` is
stored. The console keeps ``{user, csrf, token_id, secret}`` in a cookie signed with
``settings.session_secret`` (itsdangerous, time-stamped); every console form and
every cookie-authenticated unsafe API call must carry that csrf token. ``secret`` is the
console session's own secret, made by the database at sign-in (``triloop_sign_in``) after
it checked the person's API token; the database keeps only its sha256 and checks the raw
secret again whenever a decision or an audit row speaks for the person, so the signing key
alone does not make a session.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass, field

from itsdangerous import BadSignature, URLSafeTimedSerializer

SESSION_COOKIE = "triloop_session"
LOGIN_CSRF_COOKIE = "triloop_login_csrf"
FLASH_COOKIE = "triloop_flash"
CSRF_HEADER = "x-csrf-token"
CSRF_FIELD = "csrf_token"
TOKEN_PREFIX = "tl_"


def new_token() -> str:
    """A fresh API token (shown once, never stored)."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    """What the database stores for a token."""
    return hashlib.sha256(token.encode()).hexdigest()


def new_csrf_token() -> str:
    """A fresh CSRF token."""
    return secrets.token_urlsafe(24)


def same_secret(given: str | None, expected: str | None) -> bool:
    """Constant-time comparison that is false when either side is missing."""
    if not given or not expected:
        return False
    return hmac.compare_digest(given.encode(), expected.encode())


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer`` header, if any."""
    if not authorization:
        return None
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


@dataclass(frozen=True)
class ConsoleSession:
    """What the signed session cookie holds: who, the csrf token, and the API token used."""

    user: str
    csrf: str
    token_id: str | None = None
    secret: str | None = field(default=None, repr=False)


class CookieSigner:
    """Signs and checks the console's cookies with the session secret."""

    def __init__(self, secret: str, *, session_max_age_s: int) -> None:
        self.session_max_age_s = session_max_age_s
        self._session = URLSafeTimedSerializer(secret, salt="triloop.session")
        self._login = URLSafeTimedSerializer(secret, salt="triloop.login-csrf")
        self._flash = URLSafeTimedSerializer(secret, salt="triloop.flash")

    def dump_session(self, session: ConsoleSession) -> str:
        """Cookie value for a signed-in user."""
        return self._session.dumps({"user": session.user, "csrf": session.csrf,
                                    "token_id": session.token_id, "secret": session.secret})

    def load_session(self, value: str | None) -> ConsoleSession | None:
        """The session in a cookie, or None when missing, forged or older than the max age.

        The age comes from the timestamp signed into the cookie, so a browser that
        keeps the cookie past its ``Max-Age`` gains nothing.
        """
        data = _load(self._session, value, self.session_max_age_s)
        if not isinstance(data, dict):
            return None
        user, csrf, token_id = data.get("user"), data.get("csrf"), data.get("token_id")
        secret = data.get("secret")
        if not isinstance(user, str) or not isinstance(csrf, str) or not isinstance(secret, str):
            return None  # a cookie from before console sessions had secrets: sign in again
        if token_id is not None and not isinstance(token_id, str):
            return None
        return ConsoleSession(user=user, csrf=csrf, token_id=token_id, secret=secret)

    def dump_login_csrf(self, token: str) -> str:
        """Cookie value binding the login form's csrf token to this browser."""
        return self._login.dumps(token)

    def load_login_csrf(self, value: str | None) -> str | None:
        """The login csrf token in a cookie (valid for an hour)."""
        data = _load(self._login, value, 3600)
        return data if isinstance(data, str) else None

    def dump_flash(self, kind: str, text: str) -> str:
        """Cookie value of a one-time notice shown on the next page."""
        return self._flash.dumps([kind, text])

    def load_flash(self, value: str | None) -> tuple[str, str] | None:
        """The notice in a flash cookie (valid for five minutes)."""
        data = _load(self._flash, value, 300)
        if isinstance(data, list) and len(data) == 2 and all(isinstance(x, str) for x in data):
            return data[0], data[1]
        return None


def _load(serializer: URLSafeTimedSerializer, value: str | None, max_age: int) -> object:
    if not value:
        return None
    try:
        return serializer.loads(value, max_age=max_age)
    except BadSignature:  # also covers SignatureExpired
        return None
