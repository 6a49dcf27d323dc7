"""The gateway over HTTP on a loopback port: the three model APIs and the episode's
environment, per agent session.

A session is named in the path (``/s/<session>/v1/chat/completions``, so an agent needs
only its base URL) or by the ``X-Triloop-Session`` header. Routes, under either form:

- ``POST /v1/chat/completions``, ``/v1/responses``, ``/v1/messages``: the model;
  ``"stream": true`` is answered as server-sent events with the whole text in one
  delta (the text is generated before the first event);
- ``GET /v1/models``: the checkpoint the session samples from;
- ``GET /env/observation``, ``POST /env/step`` (``{"action": text}``): the episode's
  environment, when the session has one (the command harness attaches it).

A stdlib threading server: generation is synchronous (torch, or the vLLM client), so
an event loop would add nothing, and it starts and stops within an activity.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from execution_loop.gateway.api_shapes import (
    BODIES,
    CHAT_COMPLETIONS,
    MESSAGES,
    PARSERS,
    RESPONSES,
    Completion,
    ModelRequest,
    RequestShapeError,
    error_body,
)
from execution_loop.gateway.session import Gateway, GatewayError

logger = logging.getLogger(__name__)
SESSION_HEADER = "x-triloop-session"
MAX_BODY_BYTES = 16 * 2**20
_ROUTES = {
    "/v1/chat/completions": CHAT_COMPLETIONS, "/chat/completions": CHAT_COMPLETIONS,
    "/v1/responses": RESPONSES, "/responses": RESPONSES,
    "/v1/messages": MESSAGES, "/messages": MESSAGES,
}


class EnvironmentPort(Protocol):
    """The episode's environment as the agent reaches it over HTTP."""

    def initial_observation(self) -> str:
        """The task as the agent first sees it."""
        ...

    def step(self, action: str) -> dict[str, Any]:
        """Apply one action; ``observation``, ``reward``, ``done`` (raises ``GatewayError``)."""
        ...


def _sse(events: list[tuple[str | None, dict[str, Any]]]) -> Iterator[bytes]:
    for name, data in events:
        head = f"event: {name}\n" if name else ""
        yield f"{head}data: {json.dumps(data)}\n\n".encode()


def stream_events(api: str, body: dict[str, Any], done: Completion) -> Iterator[bytes]:
    """The finished answer as the asking API's stream of events."""
    if api == CHAT_COMPLETIONS:
        chunk = {k: body[k] for k in ("id", "created", "model")} | {
            "object": "chat.completion.chunk"}
        first = chunk | {"choices": [{"index": 0, "finish_reason": None,
                                      "delta": {"role": "assistant", "content": done.text}}]}
        last = chunk | {"choices": [{"index": 0, "delta": {},
                                     "finish_reason": done.finish_reason}],
                        "usage": body["usage"]}
        yield from _sse([(None, first), (None, last)])
        yield b"data: [DONE]\n\n"
    elif api == RESPONSES:
        item = body["output"][0]
        yield from _sse([
            ("response.created", {"type": "response.created",
                                  "response": body | {"status": "in_progress", "output": []}}),
            ("response.output_text.delta", {"type": "response.output_text.delta",
                                            "item_id": item["id"], "output_index": 0,
                                            "content_index": 0, "delta": done.text}),
            ("response.output_text.done", {"type": "response.output_text.done",
                                           "item_id": item["id"], "output_index": 0,
                                           "content_index": 0, "text": done.text}),
            ("response.output_item.done", {"type": "response.output_item.done",
                                           "output_index": 0, "item": item}),
            ("response.completed", {"type": "response.completed", "response": body}),
        ])
    else:
        start = body | {"content": [], "stop_reason": None,
                        "usage": {"input_tokens": done.prompt_tokens, "output_tokens": 0}}
        yield from _sse([
            ("message_start", {"type": "message_start", "message": start}),
            ("content_block_start", {"type": "content_block_start", "index": 0,
                                     "content_block": {"type": "text", "text": ""}}),
            ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                     "delta": {"type": "text_delta", "text": done.text}}),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            ("message_delta", {"type": "message_delta",
                               "delta": {"stop_reason": body["stop_reason"],
                                         "stop_sequence": None},
                               "usage": {"output_tokens": done.completion_tokens}}),
            ("message_stop", {"type": "message_stop"}),
        ])


class GatewayServer:
    """Serves a ``Gateway`` on ``127.0.0.1`` in a background thread."""

    def __init__(self, gateway: Gateway, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.gateway = gateway
        self.environments: dict[str, EnvironmentPort] = {}
        handler = _handler_for(self)
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="gateway",
                                        daemon=True)

    @property
    def address(self) -> str:
        """``127.0.0.1:PORT``, where it listens."""
        host, port = self._server.server_address[:2]
        return f"{host!s}:{port}"

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://{self.address}"

    def session_url(self, session_id: str) -> str:
        """The base URL that names a session in its path."""
        return f"{self.url}/s/{session_id}"

    def start(self) -> GatewayServer:
        """Start serving; returns self."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> GatewayServer:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()


def _split_session(path: str, headers: Mapping[str, str]) -> tuple[str | None, str]:
    path = path.split("?", 1)[0]
    if path.startswith("/s/"):
        _, _, rest = path.partition("/s/")
        session, _, tail = rest.partition("/")
        return session, "/" + tail
    return headers.get(SESSION_HEADER), path


def _handler_for(owner: GatewayServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            """Quiet: the session's record is the log."""

        def _headers(self) -> dict[str, str]:
            return {k.lower(): v for k, v in self.headers.items()}

        def _send(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _stream(self, chunks: Iterator[bytes]) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            for chunk in chunks:
                self.wfile.write(chunk)
            self.close_connection = True

        def _read_json(self) -> Any:
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY_BYTES:
                raise GatewayError(413, f"request body over {MAX_BODY_BYTES} bytes")
            raw = self.rfile.read(length) if length else b""
            try:
                return json.loads(raw or b"null")
            except ValueError as exc:
                raise GatewayError(400, f"the body is not JSON: {exc}") from exc

        def _answer(self, api: str, work: Callable[[], None]) -> None:
            try:
                work()
            except RequestShapeError as exc:
                self._send(400, error_body(api, str(exc), kind="invalid_request_error",
                                           param=exc.param))
            except GatewayError as exc:
                self._send(exc.status, error_body(api, str(exc), kind=exc.kind,
                                                  param=exc.param, code=exc.code))
            except Exception as exc:  # a bug of ours: the agent still gets an answer
                logger.exception("gateway request failed")
                self._send(500, error_body(api, f"gateway error: {type(exc).__name__}: {exc}",
                                           kind="api_error"))

        def do_GET(self) -> None:  # noqa: N802
            session_id, route = _split_session(self.path, self._headers())

            def work() -> None:
                session = owner.gateway.session(session_id or "")
                if route in ("/v1/models", "/models"):
                    model = session.settings.policy.checkpoint_id
                    self._send(200, {"object": "list", "data": [
                        {"id": model, "object": "model", "owned_by": "triloop"}]})
                elif route == "/env/observation":
                    port = self._environment(session.id)
                    self._send(200, {"observation": port.initial_observation()})
                else:
                    raise GatewayError(404, f"no route GET {route}", code="not_found")

            self._answer(CHAT_COMPLETIONS, work)

        def do_POST(self) -> None:  # noqa: N802
            session_id, route = _split_session(self.path, self._headers())
            api = _ROUTES.get(route, CHAT_COMPLETIONS)

            def work() -> None:
                body = self._read_json()
                session = owner.gateway.session(session_id or "")
                if route == "/env/step":
                    action = body.get("action") if isinstance(body, dict) else None
                    if not isinstance(action, str):
                        raise GatewayError(400, "the body must be {\"action\": text}",
                                           param="action")
                    self._send(200, self._environment(session.id).step(action))
                    return
                if route not in _ROUTES:
                    raise GatewayError(404, f"no route POST {route}", code="not_found")
                request: ModelRequest = PARSERS[api](body)
                done = session.complete(request, self._headers())
                answer = BODIES[api](request, done)
                if request.stream:
                    self._stream(stream_events(api, answer, done))
                else:
                    self._send(200, answer)

            self._answer(api, work)

        def _environment(self, session_id: str) -> EnvironmentPort:
            port = owner.environments.get(session_id)
            if port is None:
                raise GatewayError(404, "this session has no environment", code="no_environment")
            return port

    return Handler
