"""Signed OPA bundles: OPA activates only policy and token bundles signed by the stack's key.

``dev up`` (and the test fixtures) keep one RSA key per install for bundle signing in the
secrets folder; ``opa build --signing-key`` packs the policy folder and the tokens bundle
into signed tarballs, and OPA runs with ``--verification-key``, so a policy file edited
or swapped on disk after signing, or a bundle signed with another key, is refused when
OPA starts. In production the same key signs the bundles a bundle server serves; OPA's
configuration names the public key (see docs/security.md).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from triloop.secrets import read_secret, write_secret

SIGNING_KEY = "opa-bundle-signing-key"
VERIFICATION_KEY = "opa-bundle-verification-key.pem"


class BundleBuildError(RuntimeError):
    """``opa build`` refused a bundle; the message carries what it said."""


def ensure_signing_key(secrets_dir: Path) -> tuple[Path, Path]:
    """(private key file, public key file), generated the first time."""
    if read_secret(secrets_dir, SIGNING_KEY) is None:
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        write_secret(secrets_dir, SIGNING_KEY, key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()).decode())
    private = secrets_dir / SIGNING_KEY
    loaded = serialization.load_pem_private_key(private.read_bytes(), password=None)
    public = secrets_dir / VERIFICATION_KEY
    write_secret(secrets_dir, VERIFICATION_KEY, loaded.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode())
    return private, public


def build_signed(opa: str, source: Path, output: Path, signing_key: Path) -> Path:
    """``opa build --bundle source`` signed with ``signing_key`` into ``output``."""
    output.parent.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        [opa, "build", "--bundle", str(source), "--signing-key", str(signing_key),
         "--signing-alg", "RS256", "--output", str(output)],
        capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise BundleBuildError(f"opa build of {source} failed: {result.stderr.strip()}")
    return output
