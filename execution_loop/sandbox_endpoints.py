"""Named network endpoints a contract allows agent code to reach from a network-less sandbox.

The bubblewrap sandbox has no network at all. A contract may name endpoints in its
``network`` section (``name: "host:port"``); for each run the worker then listens on a
Unix socket ``<name>.sock`` in a folder mounted at ``ENDPOINTS_DIR`` inside the sandbox,
and relays each connection to that endpoint and nowhere else. The command finds the
socket in ``TRILOOP_ENDPOINT_<NAME>`` (HTTP clients speak over it: ``httpx``'s
``HTTPTransport(uds=...)``, ``curl --unix-socket``). Any other address stays unreachable.

A program that speaks plain HTTP to a TCP address (a black-box agent's
``OPENAI_BASE_URL``) gets a *loopback* endpoint instead: the same relay, plus a small
forwarder (``LOOPBACK_FORWARDER``) started inside the sandbox before the program. It
listens on ``127.0.0.1:<port>`` in the sandbox's own network namespace (the port of the
host address it stands for, so URLs stay as they are) and forwards each connection to
the endpoint's Unix socket; then the program replaces it, keeping its pid and its exit
status, while a forked copy keeps forwarding until the sandbox ends.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Mapping
from pathlib import Path

ENDPOINTS_DIR = "/run/triloop/endpoints"
_CHUNK = 65536

# Runs as `python -I -S -B -c LOOPBACK_FORWARDER port=socket... -- argv...` inside the
# sandbox. One process, one thread (threads would count against the sandbox's process
# limit); a blocking send with a timeout is enough for HTTP, where one side talks at a time.
LOOPBACK_FORWARDER = """
import os, selectors, socket, sys
split = sys.argv.index("--")
argv = sys.argv[split + 1:]
listeners = {}
for route in sys.argv[1:split]:
    port, path = route.split("=", 1)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", int(port)))
    listener.listen(64)
    listeners[listener] = path
if os.fork() != 0:
    for listener in listeners:
        listener.close()
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        sys.stderr.write(f"sandbox: cannot start {argv[0]!r}: {exc}\\n")
        os._exit(127)
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)
chooser = selectors.DefaultSelector()
for listener, path in listeners.items():
    chooser.register(listener, selectors.EVENT_READ, path)
peers = {}
def close(end):
    for sock in (end, peers.pop(end, None)):
        if sock is not None:
            peers.pop(sock, None)
            try:
                chooser.unregister(sock)
            except (KeyError, ValueError):
                pass
            sock.close()
while True:
    for key, _ in chooser.select():
        sock = key.fileobj
        if sock in listeners:
            try:
                inside, _ = sock.accept()
            except OSError:
                continue
            outside = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                outside.connect(key.data)
            except OSError:
                inside.close()
                outside.close()
                continue
            for a, b in ((inside, outside), (outside, inside)):
                a.settimeout(30)
                peers[a] = b
                chooser.register(a, selectors.EVENT_READ)
            continue
        if sock not in peers:
            continue
        try:
            chunk = sock.recv(65536)
            if chunk:
                peers[sock].sendall(chunk)
        except OSError:
            chunk = b""
        if not chunk:
            close(sock)
"""


def parse_endpoint(value: str) -> tuple[str, int]:
    """``"host:port"`` as a pair; ``ValueError`` naming the problem otherwise."""
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected 'host:port', got {value!r}")
    return host.strip("[]"), int(port)


def endpoint_variable(name: str) -> str:
    """The variable naming an endpoint's socket inside the sandbox."""
    return f"TRILOOP_ENDPOINT_{name.upper()}"


def loopback_argv(python: str, ports: Mapping[str, int], argv: list[str]) -> list[str]:
    """``argv`` behind the forwarder: each named endpoint on ``127.0.0.1:<port>`` inside."""
    routes = [f"{port}={ENDPOINTS_DIR}/{name}.sock" for name, port in sorted(ports.items())]
    return [python, "-I", "-S", "-B", "-c", LOOPBACK_FORWARDER, *routes, "--", *argv]


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
