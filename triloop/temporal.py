"""Connecting to Temporal as a service: its own token, its own loop's namespace.

Every client, worker and replayer uses ``DATA_CONVERTER``, temporalio's pydantic converter:
a workflow or activity input may carry a pydantic model (the typed ``RunConfig``) inside its
dataclass, and it arrives as that model, validated once on the way in.
"""

from __future__ import annotations

from temporalio.client import Client, TLSConfig
from temporalio.contrib.pydantic import pydantic_data_converter

from triloop.config import LoopName, ServiceName, Settings

# One converter for the whole project: a payload written by one service is read by another.
DATA_CONVERTER = pydantic_data_converter


async def connect(
    settings: Settings, *, identity: str, service: ServiceName, loop: LoopName | None = None
) -> Client:
    """A client in ``loop``'s namespace (default: the service's own) with the service's token.

    The token (a JWT the server verifies) is what the server's authorizer trusts; the
    identity only names the process in workflow histories.
    """
    tls: TLSConfig | bool = False
    if settings.temporal_tls_cert and settings.temporal_tls_key:
        tls = TLSConfig(
            client_cert=settings.temporal_tls_cert.read_bytes(),
            client_private_key=settings.temporal_tls_key.read_bytes(),
        )
    if loop is None:
        if service == "web":
            raise ValueError("the web service works in every loop's namespace: name the loop")
        loop = service
    return await Client.connect(
        settings.temporal_address,
        namespace=settings.temporal_namespace(loop),
        identity=identity,
        api_key=settings.temporal_credential(service),
        tls=tls,
        data_converter=DATA_CONVERTER,
    )


def in_namespace(client: Client, settings: Settings, loop: LoopName) -> Client:
    """The same connection and token, working in another loop's namespace (web only)."""
    config = client.config()
    config["namespace"] = settings.temporal_namespace(loop)
    return Client(**config)
