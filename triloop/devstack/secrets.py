"""The console's session secret and the stack's signing keys, kept with the other secrets.

``triloop dev up`` asks for it once per install (``triloop.secrets``: folder 0700, file
0600, refused when others may read it) and hands it to the web process only, in its
environment; no other service sees it.
"""

from __future__ import annotations

from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from triloop.secrets import SecretFileError, ensure_secret, read_secret, write_secret

SESSION_SECRET_FILE = "session_secret"

__all__ = ["SESSION_SECRET_FILE", "SecretFileError", "ensure_rsa_key", "ensure_session_secret"]


def ensure_session_secret(home: Path) -> str:
    """The install's session secret, generated on first use."""
    value = ensure_secret(home / "secrets", SESSION_SECRET_FILE)
    if len(value) < 32:
        raise SecretFileError(f"{home / 'secrets' / SESSION_SECRET_FILE} holds fewer than 32"
                              " characters; delete it to regenerate")
    return value


def ensure_rsa_key(secrets_dir: Path, name: str) -> rsa.RSAPrivateKey:
    """An RSA signing key kept as a PEM secret file, generated (2048 bits) the first time.

    The stack signs Temporal tokens and OPA bundles with keys made here; only the
    operator's secrets folder holds them, never a service's.
    """
    pem = read_secret(secrets_dir, name)
    if pem is None:
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
        write_secret(secrets_dir, name, pem)
    loaded = serialization.load_pem_private_key(pem.encode(), password=None)
    if not isinstance(loaded, rsa.RSAPrivateKey):
        raise SecretFileError(f"{secrets_dir / name} is not an RSA private key; delete it to"
                              " generate a new one")
    return loaded
