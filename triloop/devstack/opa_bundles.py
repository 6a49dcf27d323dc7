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

from triloop.devstack.secrets import ensure_rsa_key
from triloop.secrets import write_secret

SIGNING_KEY = "opa-bundle-signing-key"
VERIFICATION_KEY = "opa-bundle-verification-key.pem"


class BundleBuildError(RuntimeError):
    """``opa build`` refused a bundle; the message carries what it said."""


def ensure_signing_key(secrets_dir: Path) -> tuple[Path, Path]:
    """(private key file, public key file), generated the first time."""
    key = ensure_rsa_key(secrets_dir, SIGNING_KEY)
    write_secret(secrets_dir, VERIFICATION_KEY, key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode())
    return secrets_dir / SIGNING_KEY, secrets_dir / VERIFICATION_KEY


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
