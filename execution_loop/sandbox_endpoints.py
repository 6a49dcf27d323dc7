"""Named network endpoints a contract allows agent code to reach from a network-less sandbox.

The bubblewrap sandbox has no network at all. A contract may name endpoints in its
``network`` section (``name: "host:port"``); for each run the worker then listens on a
Unix socket ``<name>.sock`` in a folder mounted at ``ENDPOINTS_DIR`` inside the sandbox,
and relays each connection to that endpoint and nowhere else. The command finds the
socket in ``TRILOOP_ENDPOINT_<NAME>`` (HTTP clients speak over it: ``httpx``'s
``HTTPTransport(uds=...)``, ``curl --unix-socket``). Any other address stays unreachable.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Mapping
from pathlib import Path

ENDPOINTS_DIR = "/run/triloop/endpoints"
_CHUNK = 65536


def parse_endpoint(value: str) -> tuple[str, int]:
    """``"host:port"`` as a pair; ``ValueError`` naming the problem otherwise."""
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected 'host:port', got {value!r}")
    return host.strip("[]"), int(port)


def endpoint_variable(name: str) -> str:
    """The variable naming an endpoint's socket inside the sandbox."""
    return f"TRILOOP_ENDPOINT_{name.upper()}"


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while chunk := source.recv(_CHUNK):
            sink.sendall(chunk)
    except OSError:
        pass  # either side went away: the relay ends
    finally:
        for end in (source, sink):
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed


class EndpointRelay:
    """Unix sockets in ``folder`` relaying to the named endpoints, for one command."""

    def __init__(self, folder: Path, endpoints: Mapping[str, str], uid: int = -1) -> None:
        self.folder = folder
        self._listeners: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self.variables: dict[str, str] = {}
        for name, value in sorted(endpoints.items()):
            target = parse_endpoint(value)
            path = folder / f"{name}.sock"
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(str(path))
            if uid >= 0:
                os.chown(path, uid, uid)
            listener.listen(16)
            self._listeners.append(listener)
            thread = threading.Thread(target=self._serve, args=(listener, target), daemon=True)
            thread.start()
            self._threads.append(thread)
            self.variables[endpoint_variable(name)] = f"{ENDPOINTS_DIR}/{name}.sock"

    def _serve(self, listener: socket.socket, target: tuple[str, int]) -> None:
        while True:
            try:
                inside, _ = listener.accept()
            except OSError:
                return  # closed: the command is over
            try:
                outside = socket.create_connection(target, timeout=10)
            except OSError:
                inside.close()
                continue
            outside.settimeout(None)
            for a, b in ((inside, outside), (outside, inside)):
                threading.Thread(target=_pump, args=(a, b), daemon=True).start()

    def close(self) -> None:
        """Stop listening; connections in flight end with the command's sockets."""
        for listener in self._listeners:
            try:
                listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # never connected
            listener.close()
        for thread in self._threads:
            thread.join(timeout=2.0)
