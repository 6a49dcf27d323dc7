"""The Temporal server's token signing key and each service's token, made by ``dev up``.

The real Temporal server checks every call with its default JWT claim mapper and default
authorizer: a token's ``permissions`` claim lists ``<namespace>:<role>`` entries (role ``read``,
``write`` or ``admin``; the namespace ``temporal-system`` stands for the whole cluster),
and a call that changes a namespace needs ``write`` there. In front of it, triloop's own
authorizer (``tools/temporal-server``, keyed on each token's subject) narrows the service
tokens further: none may reset, terminate or cancel a governance workflow, the web token
writes only starts, signals and named updates, and none reaches the Nexus HTTP API.
One RSA key per install signs the tokens; its private half stays in the operator's
secrets folder (never handed to a service), its public half is the JWKS file the server
reads. Each service gets a token for its own loop's namespace only, so the learning
worker's credentials cannot start, signal, update, terminate or reset a governance
workflow: the server refuses them.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
from pathlib import Path

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from triloop.config import LOOPS, SERVICES, Settings
from triloop.devstack.secrets import ensure_rsa_key
from triloop.secrets import replace_file, temporal_token_name, write_secret

SIGNING_KEY = "temporal-signing-key"
ADMIN = "admin"  # the operator's own token: namespaces and Nexus endpoints, never a service's
TOKEN_LIFETIME_S = 30 * 86400
CLUSTER_SCOPE = "temporal-system"  # the server's name for cluster-wide permissions


def permissions(settings: Settings, holder: str) -> list[str]:
    """What each holder may do: a loop writes in its own namespace only.

    The web service carries authenticated people's decisions into every loop (it starts
    runs and production episodes, sends decision ids), so it writes in all three; the
    decisions themselves are rows only ``triloop_web`` can insert, re-checked by the loop.
    """
    if holder == ADMIN:
        return [f"{CLUSTER_SCOPE}:admin"]
    if holder == "web":
        return [f"{settings.temporal_namespace(loop)}:write" for loop in LOOPS]
    if holder in LOOPS:
        return [f"{settings.temporal_namespace(holder)}:write"]
    raise ValueError(f"no Temporal permissions for {holder!r}")


def token_subject(holder: str) -> str:
    """The ``sub`` claim of ``holder``'s token: the server's authorizer keys its rules on it."""
    return f"triloop-{holder}"


def authorizer_policy(settings: Settings) -> dict[str, object]:
    """Who holds which token, for the server's authorizer (``tools/temporal-server``).

    Its rules are Go; this names the governance namespace and each loop token's own one.
    The admin token is not listed: the authorizer does not narrow it.
    """
    return {"governance_namespace": settings.temporal_namespace("governance"),
            "loops": {token_subject(loop): settings.temporal_namespace(loop) for loop in LOOPS},
            "web": token_subject("web")}


def ensure_signing_key(secrets_dir: Path) -> rsa.RSAPrivateKey:
    """The install's token signing key, generated the first time."""
    return ensure_rsa_key(secrets_dir, SIGNING_KEY)


def key_id(key: rsa.RSAPrivateKey) -> str:
    """A stable id of the key: the sha256 of its public half, shortened."""
    der = key.public_key().public_bytes(serialization.Encoding.DER,
                                        serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(der).hexdigest()[:16]


def write_jwks(key: rsa.RSAPrivateKey, path: Path) -> None:
    """The public key as a JWKS document, the form the server's key provider reads."""
    numbers = key.public_key().public_numbers()
    jwk = {"kty": "RSA", "use": "sig", "alg": "RS256", "kid": key_id(key),
           "n": _b64_uint(numbers.n), "e": _b64_uint(numbers.e)}
    path.parent.mkdir(parents=True, exist_ok=True)
    # The server's folder is its OS user's (dev up as root): never write through a link.
    replace_file(path, json.dumps({"keys": [jwk]}), mode=0o644)


def mint_token(key: rsa.RSAPrivateKey, *, subject: str, grants: list[str],
               now: float | None = None, lifetime_s: int = TOKEN_LIFETIME_S) -> str:
    """A signed token naming ``subject`` with ``grants`` as its permissions."""
    issued = int(time.time() if now is None else now)
    claims = {"sub": subject, "permissions": grants, "iat": issued,
              "exp": issued + lifetime_s}
    return jwt.encode(claims, key, algorithm="RS256", headers={"kid": key_id(key)})


def ensure_tokens(settings: Settings, jwks_path: Path) -> None:
    """Write the JWKS and a fresh token per service (and the operator's) into secrets.

    Tokens are re-minted at every ``dev up``: a running service keeps the one it read
    until it expires, a restarted one reads the new one.
    """
    key = ensure_signing_key(settings.secrets)
    write_jwks(key, jwks_path)
    for holder in (*SERVICES, ADMIN):
        token = mint_token(key, subject=token_subject(holder), grants=permissions(settings, holder))
        write_secret(settings.secrets, temporal_token_name(holder), token)


def _b64_uint(value: int) -> str:
    raw = value.to_bytes((value.bit_length() + 7) // 8, "big")
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
