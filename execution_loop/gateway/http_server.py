"""The gateway over HTTP on a loopback port: the three model APIs and the episode's
environment, per agent session.

A session is named in the path (``/s/<session>/v1/chat/completions``, so an agent needs
only its base URL) or by the ``X-Triloop-Session`` header. Routes, under either form:

- ``POST /v1/chat/completions``, ``/v1/responses``, ``/v1/messages``: the model;
  ``"stream": true`` is answered as server-sent events written as the answer is
  sampled (``streams``);
- ``POST /v1/messages/count_tokens``: the prompt's tokens, without sampling;
- ``GET /v1/models``, ``GET /v1/models/<id>``: the checkpoint the session samples from,
  in Anthropic's shape when the request carries ``anthropic-version`` (its SDK always
  does), else OpenAI's; errors likewise come in the asking API's shape;
- ``GET /env/observation``, ``POST /env/step`` (``{"action": text}``): the episode's
  environment, when the session has one (the command harness attaches it).

A stdlib threading server: generation is synchronous (torch, or the vLLM client), so
an event loop would add nothing, and it starts and stops within an activity.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from execution_loop.gateway.api_bodies import BODIES, error_body
from execution_loop.gateway.api_shapes import (
    CHAT_COMPLETIONS,
    MESSAGES,
    PARSERS,
    RESPONSES,
    ModelRequest,
    RequestShapeError,
    parse_anthropic_messages,
)
from execution_loop.gateway.session import AgentSession, Gateway, GatewayError
from execution_loop.gateway.streams import AnswerEvents

logger = logging.getLogger(__name__)
SESSION_HEADER = "x-triloop-session"
ANTHROPIC_HEADER = "anthropic-version"
COUNT_TOKENS = ("/v1/messages/count_tokens", "/messages/count_tokens")
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


def models_body(session: AgentSession, *, anthropic: bool,
                model_id: str | None = None) -> dict[str, Any]:
    """The session's model as a list, or one model (404 for another id)."""
    model = session.settings.policy.checkpoint_id
    if model_id is not None and model_id != model:
        raise GatewayError(404, f"The model '{model_id}' does not exist", code="model_not_found",
                           kind="invalid_request_error", param="model")
    card: dict[str, Any] = (
        {"type": "model", "id": model, "display_name": model,
         "created_at": "1970-01-01T00:00:00Z"} if anthropic
        else {"id": model, "object": "model", "created": 0, "owned_by": "triloop"})
    if model_id is not None:
        return card
    if anthropic:
        return {"data": [card], "has_more": False, "first_id": model, "last_id": model}
    return {"object": "list", "data": [card]}


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

        def _start_stream(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()

        def _write_event(self, data: bytes) -> None:
            self.wfile.write(data)
            self.wfile.flush()

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
                self._send(400, error_body(api, str(exc), status=400,
                                           kind="invalid_request_error", param=exc.param))
            except GatewayError as exc:
                self._send(exc.status, error_body(api, str(exc), status=exc.status,
                                                  kind=exc.kind, param=exc.param,
                                                  code=exc.code))
            except Exception as exc:  # a bug of ours: the agent still gets an answer
                logger.exception("gateway request failed")
                self._send(500, error_body(api, f"gateway error: {type(exc).__name__}: {exc}",
                                           status=500, kind="api_error"))

        def do_GET(self) -> None:  # noqa: N802
            session_id, route = _split_session(self.path, self._headers())
            anthropic = ANTHROPIC_HEADER in self._headers()

            def work() -> None:
                session = owner.gateway.session(session_id or "")
                if route in ("/v1/models", "/models"):
                    self._send(200, models_body(session, anthropic=anthropic))
                elif route.startswith(("/v1/models/", "/models/")):
                    model_id = route.split("/models/", 1)[1]
                    self._send(200, models_body(session, anthropic=anthropic,
                                                model_id=model_id))
                elif route == "/env/observation":
                    port = self._environment(session.id)
                    self._send(200, {"observation": port.initial_observation()})
                else:
                    raise GatewayError(404, f"no route GET {route}", code="not_found")

            self._answer(MESSAGES if anthropic else CHAT_COMPLETIONS, work)

        def do_POST(self) -> None:  # noqa: N802
            session_id, route = _split_session(self.path, self._headers())
            fallback = MESSAGES if ANTHROPIC_HEADER in self._headers() else CHAT_COMPLETIONS
            api = MESSAGES if route in COUNT_TOKENS else _ROUTES.get(route, fallback)

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
                if route in COUNT_TOKENS:
                    counted = parse_anthropic_messages(body, counting=True)
                    self._send(200, {"input_tokens": session.count_tokens(counted)})
                    return
                if route not in _ROUTES:
                    raise GatewayError(404, f"no route POST {route}", code="not_found")
                request: ModelRequest = PARSERS[api](body)
                if request.stream:
                    self._answer_streamed(api, session, request)
                    return
                done = session.complete(request, self._headers())
                self._send(200, BODIES[api](request, done))

            self._answer(api, work)

        def _answer_streamed(self, api: str, session: AgentSession,
                             request: ModelRequest) -> None:
            """Stream the answer; an error before its first event is a plain error."""
            events = AnswerEvents(api, request, self._write_event, self._start_stream)
            try:
                done = session.complete(request, self._headers(), stream=events)
            except GatewayError as exc:
                if not events.started:
                    raise
                events.fail(exc.status, str(exc), kind=exc.kind, code=exc.code)
            else:
                events.finish(done, BODIES[api](request, done))
            self.close_connection = True

        def _environment(self, session_id: str) -> EnvironmentPort:
            port = owner.environments.get(session_id)
            if port is None:
                raise GatewayError(404, "this session has no environment", code="no_environment")
            return port

    return Handler
