"""The Temporal server's own certificate: mutual TLS on every port between its services.

``dev up`` (and the test fixture) make a small CA and one certificate for the server's
processes into the server's own secrets folder (``<state>/secrets``, 0700). Every internal
port (the internal frontend's gRPC and HTTP, history, matching, worker, each ring
membership port) then accepts only a client that shows this certificate: the server's own
services. The CA's private key is never written: once the certificate is issued nobody,
the operator included, can issue another, so a copy of these files is the only way in;
delete the folder and ``dev up`` makes a new pair. Clients of the public frontend are not
concerned: they keep showing a JWT token over plain TCP on loopback.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from triloop.secrets import read_secret, write_secret

# The name every internal client checks the server's certificate against (config
# ``internode.client.serverName``), whatever loopback address it dials.
INTERNODE_SERVER_NAME = "temporal-internode"
CA_FILE = "internode-ca.pem"
CERT_FILE = "internode.pem"
KEY_FILE = "internode.key"
VALIDITY = datetime.timedelta(days=3650)  # no renewal path: the CA key is gone (see above)


@dataclass(frozen=True)
class InternodeTLS:
    """Paths of the server's certificate, its key and the CA that issued it."""

    ca: Path
    cert: Path
    key: Path


def ensure_internode_tls(secrets_dir: Path) -> InternodeTLS:
    """The server's certificate files in ``secrets_dir``, made the first time."""
    files = InternodeTLS(ca=secrets_dir / CA_FILE, cert=secrets_dir / CERT_FILE,
                         key=secrets_dir / KEY_FILE)
    if all(read_secret(secrets_dir, p.name) is not None for p in (files.ca, files.cert,
                                                                      files.key)):
        return files
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "triloop temporal internode CA")])
    ca = _certificate(ca_name, ca_name, ca_key.public_key(), ca_key, is_ca=True)
    key = ec.generate_private_key(ec.SECP256R1())
    leaf_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, INTERNODE_SERVER_NAME)])
    leaf = _certificate(leaf_name, ca_name, key.public_key(), ca_key, is_ca=False)
    write_secret(secrets_dir, KEY_FILE, key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()).decode())
    write_secret(secrets_dir, CERT_FILE, _pem(leaf))
    write_secret(secrets_dir, CA_FILE, _pem(ca))
    return files


def internode_tls_config(files: InternodeTLS) -> dict[str, object]:
    """``global.tls`` of the server's config: internode mutual TLS, the frontend's untouched."""
    return {"internode": {
        "server": {"certFile": str(files.cert), "keyFile": str(files.key),
                   "requireClientAuth": True, "clientCaFiles": [str(files.ca)]},
        "client": {"serverName": INTERNODE_SERVER_NAME, "rootCaFiles": [str(files.ca)]},
    }}


def _certificate(subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey,
                 signer: ec.EllipticCurvePrivateKey, *, is_ca: bool) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
               .public_key(public_key).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + VALIDITY)
               .add_extension(x509.BasicConstraints(ca=is_ca, path_length=0 if is_ca else None),
                              critical=True))
    if is_ca:
        builder = builder.add_extension(x509.KeyUsage(
            digital_signature=False, content_commitment=False, key_encipherment=False,
            data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
            encipher_only=False, decipher_only=False), critical=True)
    else:
        # One certificate serves both ends: each service is a server to the others and a
        # client of them.
        builder = builder.add_extension(x509.SubjectAlternativeName([
            x509.DNSName(INTERNODE_SERVER_NAME), x509.DNSName("localhost"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        builder = builder.add_extension(x509.ExtendedKeyUsage(
            [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    return builder.sign(signer, hashes.SHA256())


def _pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()
