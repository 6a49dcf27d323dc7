"""An OpenEnv environment server behind the ``Environment`` interface (built-in ``openenv``).

OpenEnv (openenv-core) serves an environment with FastAPI: ``POST /reset``, ``POST /step``,
``GET /state``, ``/schema``, ``/metadata``, ``/health`` and a WebSocket ``/ws``. Its HTTP
``/reset`` and ``/step`` build a fresh environment instance per request and close it
after (``HTTPEnvServer.reset_handler``/``step_handler``), so a step over HTTP never sees
the reset before it: measured on the countdown example, ``/reset {"seed": 1}`` answers
``left: 4`` and the next ``/step`` answers ``left: -1``, a new instance's. An episode
with more than one turn lives only in a ``/ws`` session (one instance per connection),
which is what openenv-core's own ``EnvClient`` speaks; so does this adapter:
``{"type": "reset", "data": {"seed": ...}}``, ``{"type": "step", "data": <action>}``,
``{"type": "state"}``, ``{"type": "close"}``, answered with ``observation``/``state``/
``error`` messages.

The contract's ``initial_state`` names the server (``url``), the action's text field
(``action_field``: the model's text goes there), the observation field shown to the
model (``observation_field``), the digest of the server's ``GET /schema`` and
``/metadata`` (``schema_digest``, checked on opening and by the verifier, so another
server or a changed interface is refused), the return that counts as success
(``success_reward``) and a reference script (``reference_actions``, ``" | "`` between
actions: OpenEnv has no reference or oracle endpoint).

The verdict is taken as a served environment's is (``service``): not in the worker, but
in triloop's verifier process, which here opens its own session, resets it with the seed
and replays the model's raw actions (``verify``), then pays the contract's outcome terms
on whether the server's rewards reach ``success_reward``: the server reports what
happened, never its own pay. A server refusing an action (OpenEnv's validation error) is
the ``invalid_action`` process term; unreachable is ``ServiceUnavailable``, retried.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from execution_loop.environments.base import (
    EnvironmentStateError,
    EnvironmentUnavailable,
    Outcome,
    StepResult,
    TaskCapabilities,
    fingerprint,
    refuse_item,
)
from execution_loop.environments.service_verifier import ServiceVerdictError, pay
from execution_loop.verification import VerifierRequest, run_verifier

if TYPE_CHECKING:
    from execution_loop.sandbox import SandboxBackend
    from triloop.contracts import EnvironmentContract

VERIFIER = "execution_loop.environments.openenv:verify"
VERIFIER_DISTRIBUTIONS = ("websockets",)  # the verifier's WebSocket client
CAPABILITIES = TaskCapabilities(
    actions=frozenset({"text"}),
    observations=frozenset({"text"}),
    success_criteria=frozenset({"goal_reached"}),
    outcome_terms=frozenset({"success", "failure"}),
    process_terms=frozenset({"valid_action", "invalid_action"}),
    initial_state={"url": (str,), "action_field": (str,), "observation_field": (str,),
                   "schema_digest": (str,), "success_reward": (int, float),
                   "reference_actions": (str,), "timeout_s": (int, float)},
    required_state=frozenset({"url", "action_field", "schema_digest"}),
)


class OpenEnvUnavailable(EnvironmentUnavailable):
    """The OpenEnv server could not be reached: infrastructure, retried."""


class OpenEnvProtocolError(RuntimeError):
    """The server answered, but not as OpenEnv does, or is not the one the contract pins."""


@dataclass(frozen=True)
class Server:
    """Where the server is and how its messages map to text, from ``initial_state``."""

    url: str
    action_field: str
    observation_field: str
    schema_digest: str
    success_reward: float
    timeout_s: float

    @classmethod
    def of(cls, state: Mapping[str, Any]) -> Server:
        return cls(url=str(state["url"]).rstrip("/"), action_field=str(state["action_field"]),
                   observation_field=str(state.get("observation_field", "")),
                   schema_digest=str(state["schema_digest"]),
                   success_reward=float(state.get("success_reward", 1.0)),
                   timeout_s=float(state.get("timeout_s", 30.0)))

    @property
    def ws_url(self) -> str:
        scheme, _, rest = self.url.partition("://")
        return f"{'wss' if scheme == 'https' else 'ws'}://{rest}/ws"


def _get(server: Server, path: str) -> Any:
    try:
        with urllib.request.urlopen(f"{server.url}{path}", timeout=server.timeout_s) as reply:
            return json.loads(reply.read().decode("utf-8"))
    except (urllib.error.URLError, OSError) as exc:
        raise OpenEnvUnavailable(f"OpenEnv server {server.url}{path}: {exc}") from exc
    except ValueError as exc:
        raise OpenEnvProtocolError(f"OpenEnv server {server.url}{path} sent no JSON") from exc


def schema_digest(url: str, timeout_s: float = 30.0) -> str:
    """sha256 of the server's ``GET /schema`` and ``GET /metadata`` (what a contract pins)."""
    server = Server(url.rstrip("/"), "", "", "", 1.0, timeout_s)
    served = {"schema": _get(server, "/schema"), "metadata": _get(server, "/metadata")}
    return fingerprint(served)


def check_server(server: Server) -> None:
    """Refuse a server whose interface is not the pinned one, or whose action has no field."""
    found = schema_digest(server.url, server.timeout_s)
    if found != server.schema_digest:
        raise OpenEnvProtocolError(f"OpenEnv server {server.url} has schema digest {found}, "
                                   f"the contract pins {server.schema_digest}")
    action = _get(server, "/schema").get("action", {})
    if server.action_field not in action.get("properties", {}):
        raise OpenEnvProtocolError(f"OpenEnv server {server.url}'s action has no field "
                                   f"{server.action_field!r}")


@dataclass
class Session:
    """One OpenEnv ``/ws`` session: an environment instance of its own on the server."""

    server: Server
    _ws: Any = field(default=None, repr=False)
    _open: ExitStack = field(default_factory=ExitStack, repr=False)

    def _send(self, message: dict[str, Any]) -> dict[str, Any]:
        from websockets.exceptions import ConnectionClosed, WebSocketException
        from websockets.sync.client import connect

        try:
            if self._ws is None:
                self._ws = self._open.enter_context(connect(
                    self.server.ws_url, open_timeout=self.server.timeout_s,
                    close_timeout=self.server.timeout_s))
            try:
                self._ws.send(json.dumps(message))
            except ConnectionClosed:
                pass  # closed on arrival: the server's reason may be waiting below
            reply = json.loads(self._ws.recv(timeout=self.server.timeout_s))
        except (OSError, TimeoutError, WebSocketException) as exc:
            self._drop()  # the next call opens a new session
            raise OpenEnvUnavailable(f"OpenEnv session {self.server.ws_url}: {exc}") from exc
        except ValueError as exc:
            raise OpenEnvProtocolError(f"OpenEnv session {self.server.ws_url} sent no JSON") \
                from exc
        if not isinstance(reply, dict) or "type" not in reply:
            raise OpenEnvProtocolError(f"OpenEnv session {self.server.ws_url} sent {reply!r}")
        if reply["type"] == "error" and (reply.get("data") or {}).get("code") == "CAPACITY_REACHED":
            self._drop()  # the server closes a session it has no room for
            raise OpenEnvUnavailable(f"OpenEnv server {self.server.url} has no room for another "
                                     f"session: {reply['data'].get('message', '')}")
        return reply

    def _drop(self) -> None:
        try:
            self._open.close()
        except Exception:  # noqa: BLE001 - already broken; only forget it
            pass
        self._ws = None

    def reset(self, seed: int) -> dict[str, Any]:
        return self._observation(self._send({"type": "reset", "data": {"seed": seed}}))

    def step(self, text: str) -> dict[str, Any] | None:
        """The server's reply to the action, or None when it refused the action."""
        reply = self._send({"type": "step", "data": {self.server.action_field: text}})
        if reply["type"] == "error" and reply.get("data", {}).get("code") == "VALIDATION_ERROR":
            return None
        return self._observation(reply)

    def state(self) -> dict[str, Any]:
        reply = self._send({"type": "state"})
        return dict(reply.get("data") or {})

    def _observation(self, reply: dict[str, Any]) -> dict[str, Any]:
        data = reply.get("data")
        if reply["type"] != "observation" or not isinstance(data, dict):
            raise OpenEnvProtocolError(f"OpenEnv session {self.server.ws_url} answered "
                                       f"{json.dumps(reply)[:500]}")
        return data

    def close(self) -> None:
        if self._ws is not None:
            try:
                self._ws.send(json.dumps({"type": "close"}))
                self._open.close()
            except Exception:  # noqa: BLE001 - the server ends a session whose socket went
                pass
            self._ws = None


def render(server: Server, data: Mapping[str, Any]) -> str:
    """The observation field the contract names, or the whole observation as JSON."""
    observation = data.get("observation") or {}
    if server.observation_field and server.observation_field in observation:
        return str(observation[server.observation_field])
    return json.dumps(observation, sort_keys=True)


class OpenEnv:
    """One episode at a time on an OpenEnv server, through one ``/ws`` session."""

    def __init__(
        self, contract: EnvironmentContract, *, sandbox: SandboxBackend | None = None
    ) -> None:
        self.contract = contract
        self._sandbox = sandbox
        self._server = Server.of(contract.initial_state)
        check_server(self._server)
        self._session = Session(self._server)
        self._seed: int | None = None
        self._actions: list[str] = []
        self._text = ""
        self._turn = 0
        self._done = False

    def reset(self, seed: int, item: Mapping[str, Any] | None = None) -> str:
        """Reset the session's environment with the seed; returns the observation's text."""
        refuse_item(self.contract.task, item)
        data = self._session.reset(seed)
        self._seed, self._actions, self._turn, self._done = seed, [], 0, bool(data.get("done"))
        self._text = render(self._server, data)
        return self._text

    def step(self, action: str) -> StepResult:
        """Send the text as the action's field; a refused action earns the invalid term."""
        if self._seed is None or self._done:
            raise EnvironmentStateError("call reset(seed) before step, and not after the end")
        self._actions.append(action)
        self._turn += 1
        data = self._session.step(action)
        process = self.contract.reward.process
        truncated = self._turn >= self.contract.limits.max_turns
        if data is None:
            self._done = truncated
            return StepResult(self._text, process.get("invalid_action", 0.0), self._done,
                              {"valid_action": False, "truncated": truncated or None})
        self._text = render(self._server, data)
        ended = bool(data.get("done"))
        self._done = ended or truncated
        feedback = {"valid_action": True, "env_reward": data.get("reward"), "done": ended,
                    "truncated": "max_turns" if truncated and not ended else None}
        return StepResult(self._text, process.get("valid_action", 0.0), self._done, feedback)

    def verifier_request(self) -> VerifierRequest:
        """What the verifier process needs to replay the episode on a session of its own."""
        if self._seed is None:
            raise EnvironmentStateError("call reset(seed) first")
        payload = {"server": dict(self.contract.initial_state), "seed": self._seed,
                   "actions": self._actions, "max_turns": self.contract.limits.max_turns,
                   "reward": dict(self.contract.reward.outcome)}
        return VerifierRequest(VERIFIER, payload)

    def outcome(self) -> Outcome:
        """The server's rewards on a replay, judged in triloop's verifier process."""
        return run_verifier(self.verifier_request(), sandbox=self._sandbox)

    def state_fingerprint(self) -> str:
        """sha256 of the observation's text, the turn and whether the episode is over."""
        if self._seed is None:
            raise EnvironmentStateError("call reset(seed) first")
        return fingerprint({"text": self._text, "turn": self._turn, "done": self._done})

    def close(self) -> None:
        """End the session on the server."""
        self._session.close()
        self._seed = None


def verify(payload: dict[str, Any]) -> Outcome:
    """Replay the raw actions on a fresh session of the pinned server; judge its rewards."""
    server = Server.of(payload["server"])
    try:
        check_server(server)
    except (OpenEnvUnavailable, OpenEnvProtocolError) as exc:
        raise ServiceVerdictError(str(exc)) from exc
    session = Session(server)
    returns, refused, done, turns = 0.0, 0, False, 0
    try:
        data = session.reset(int(payload["seed"]))
        done = bool(data.get("done"))
        for text in payload["actions"][: int(payload["max_turns"])]:
            if done:
                break
            turns += 1
            reply = session.step(str(text))
            if reply is None:
                refused += 1
                continue
            returns += float(reply.get("reward") or 0.0)
            done = bool(reply.get("done"))
    finally:
        session.close()
    success = done and returns >= server.success_reward
    reason = "goal_reached" if success else "ended_short" if done else "not_finished"
    details = {"reason": reason, "goal_reached": success, "env_return": returns,
               "turns": turns, "invalid_actions": refused, "verified_by": "openenv_replay"}
    return Outcome(success=success, reward=pay(payload["reward"], success), details=details)


def reference_solution(seed: int, contract: EnvironmentContract,
                       item: Mapping[str, Any] | None = None) -> list[str]:
    """The contract's reference script (OpenEnv defines no reference endpoint)."""
    del seed  # the same script for every seed; a seed-dependent solution needs a plugin
    refuse_item(contract.task, item)
    script = str(contract.initial_state.get("reference_actions", ""))
    return [a.strip() for a in script.split("|") if a.strip()]

