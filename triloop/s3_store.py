"""The artifact store in an S3-compatible bucket, over httpx with AWS Signature Version 4.

Blobs live at ``<prefix>/sha256/<aa>/<digest>`` in the bucket (path-style addressing,
``<endpoint>/<bucket>/<key>``, which every S3-compatible server accepts). A put sends the
body's sha256 as ``x-amz-content-sha256``, so the server can refuse a body damaged in
transit, and skips blobs already there (content addressing makes them equal). Every get is
hashed and refused if it does not match (``ArtifactCorrupted``).

Why not boto3 or s3fs: neither is in the locked dependency set, and the calls used
here (HEAD, PUT, GET, DELETE of one object) need only a request signer; fsspec (locked)
has no S3 filesystem of its own.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlparse

import httpx

from triloop.artifacts import (
    ArtifactNotFound,
    blob_key,
    sha256_file,
    verified,
    write_verified,
)

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


@dataclass(frozen=True)
class S3Credentials:
    """An access key pair and the region the signature is scoped to."""

    access_key_id: str
    secret_access_key: str
    region: str = "us-east-1"


def _hmac(key: bytes, message: str) -> bytes:
    return hmac.new(key, message.encode(), hashlib.sha256).digest()


def sign_v4(
    *, method: str, url: str, headers: Mapping[str, str], payload_sha256: str,
    credentials: S3Credentials, now: dt.datetime, service: str = "s3",
) -> dict[str, str]:
    """The headers to add to a request: ``x-amz-date``, ``x-amz-content-sha256``, auth.

    ``headers`` are the other headers to sign (``host`` is added from the URL).
    """
    parsed = urlparse(url)
    amz_date = now.strftime("%Y%m%dT%H%M%SZ")
    day = amz_date[:8]
    signed = {k.lower(): " ".join(v.strip().split()) for k, v in headers.items()}
    signed["host"] = parsed.netloc
    signed["x-amz-content-sha256"] = payload_sha256
    signed["x-amz-date"] = amz_date
    names = sorted(signed)
    query = "&".join(sorted(
        f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}"
        for k, _, v in (part.partition("=") for part in parsed.query.split("&") if part)))
    canonical = "\n".join([
        method, quote(parsed.path or "/", safe="/-_.~"), query,
        "".join(f"{name}:{signed[name]}\n" for name in names), ";".join(names), payload_sha256,
    ])
    scope = f"{day}/{credentials.region}/{service}/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope,
                         hashlib.sha256(canonical.encode()).hexdigest()])
    key = _hmac(f"AWS4{credentials.secret_access_key}".encode(), day)
    for part in (credentials.region, service, "aws4_request"):
        key = _hmac(key, part)
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    return {
        "x-amz-date": amz_date,
        "x-amz-content-sha256": payload_sha256,
        "Authorization": (f"AWS4-HMAC-SHA256 Credential={credentials.access_key_id}/{scope}, "
                          f"SignedHeaders={';'.join(names)}, Signature={signature}"),
    }


class S3StoreError(ConnectionError):
    """The bucket refused a request or could not be reached (infrastructure: retryable)."""


class S3ArtifactStore:
    """Blobs in ``s3://bucket/prefix`` on an S3-compatible endpoint."""

    def __init__(
        self, *, endpoint: str, bucket: str, prefix: str = "", credentials: S3Credentials,
        timeout: float = 60.0, transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.credentials = credentials
        self.location = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self._http = httpx.Client(timeout=timeout, transport=transport)

    def _url(self, digest: str) -> str:
        key = f"{self.prefix}/{blob_key(digest)}" if self.prefix else blob_key(digest)
        return f"{self.endpoint}/{self.bucket}/{key}"

    def _send(self, method: str, url: str, *, payload_sha256: str = EMPTY_SHA256,
              content: bytes | Iterator[bytes] | None = None,
              headers: Mapping[str, str] | None = None, stream: bool = False) -> httpx.Response:
        extra = dict(headers or {})
        auth = sign_v4(method=method, url=url, headers=extra, payload_sha256=payload_sha256,
                       credentials=self.credentials, now=dt.datetime.now(dt.UTC))
        request = self._http.build_request(method, url, headers={**extra, **auth},
                                           content=content)
        try:
            return self._http.send(request, stream=stream)
        except httpx.HTTPError as error:
            raise S3StoreError(f"{self.location}: {method} {url} failed: {error}") from error

    def _check(self, response: httpx.Response, digest: str) -> None:
        if response.status_code == 404:
            raise ArtifactNotFound(f"no artifact with sha256 {digest} in {self.location}")
        if response.status_code >= 300:
            response.read()
            raise S3StoreError(f"{self.location}: HTTP {response.status_code} for {digest}: "
                               f"{response.text[:300]}")

    def exists(self, digest: str) -> bool:
        """Whether the blob is in the bucket."""
        response = self._send("HEAD", self._url(digest))
        if response.status_code == 404:
            return False
        self._check(response, digest)
        return True

    def delete(self, digest: str) -> None:
        """Remove a blob (retention); S3 answers 204 whether or not it was there."""
        response = self._send("DELETE", self._url(digest))
        if response.status_code != 404:
            self._check(response, digest)

    def put_bytes(self, data: bytes) -> str:
        """Store bytes (once); their digest."""
        digest = hashlib.sha256(data).hexdigest()
        if not self.exists(digest):
            self._check(self._send("PUT", self._url(digest), payload_sha256=digest,
                                   content=data,
                                   headers={"content-length": str(len(data))}), digest)
        return digest

    def put_file(self, path: Path) -> str:
        """Store a file (once), streamed; its digest."""
        digest = sha256_file(path)
        if not self.exists(digest):
            size = path.stat().st_size
            with path.open("rb") as handle:
                body = iter(lambda: handle.read(1 << 20), b"")
                self._check(self._send("PUT", self._url(digest), payload_sha256=digest,
                                       content=body, headers={"content-length": str(size)}),
                            digest)
        return digest

    def get_bytes(self, digest: str) -> bytes:
        """The blob's bytes, verified against the digest."""
        response = self._send("GET", self._url(digest))
        self._check(response, digest)
        return verified(digest, response.content, self.location)

    def get_file(self, digest: str, target: Path) -> None:
        """Stream the blob into ``target``, verified (nothing is left on a mismatch)."""
        response = self._send("GET", self._url(digest), stream=True)
        try:
            self._check(response, digest)
            write_verified(digest, response.iter_bytes(1 << 20), target, self.location)
        finally:
            response.close()

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

