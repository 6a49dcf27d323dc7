"""Connecting to Temporal with a service identity, and the task queue names."""

from __future__ import annotations

from temporalio.client import Client, TLSConfig

from triloop.config import Settings


async def connect(settings: Settings, *, identity: str) -> Client:
    """A client whose identity names the service (shown in workflow histories)."""
    tls: TLSConfig | bool = False
    if settings.temporal_tls_cert and settings.temporal_tls_key:
        tls = TLSConfig(
            client_cert=settings.temporal_tls_cert.read_bytes(),
            client_private_key=settings.temporal_tls_key.read_bytes(),
        )
    return await Client.connect(
        settings.temporal_address,
        namespace=settings.temporal_namespace,
        identity=identity,
        tls=tls,
    )
