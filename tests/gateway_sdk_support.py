"""The gateway served for the SDK conformance tests: one session, a scripted policy over
the tiny model's tokenizer (the tests are about what the official clients parse, not
about sampling), and the checks on the record both SDKs' tests share."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from execution_loop.gateway.http_server import GatewayServer
from execution_loop.gateway.session import AgentSession, Gateway, SessionSettings
from learning_loop.tiny_model import build_tokenizer
from tests.gateway_standins import ScriptedPolicy

ADD_SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"},
                                               "b": {"type": "integer"}},
              "required": ["a", "b"], "additionalProperties": False}
CALL_ADD = '<tool_call>\n{"name": "add", "arguments": {"a": 3, "b": 4}}\n</tool_call>'
# What the model writes after the forced opening of a call (tool_choice required / named).
AFTER_ANY_OPENING = 'add", "arguments": {"a": 3, "b": 4}}\n</tool_call>'
AFTER_NAMED_OPENING = '{"a": 3, "b": 4}}\n</tool_call>'
COUNTING = "one two three four five six seven eight nine ten eleven twelve"


@dataclass
class Served:
    """A running gateway with one open session."""

    server: GatewayServer
    session: AgentSession
    policy: ScriptedPolicy

    def script(self, *texts: str) -> None:
        """The policy's next answers."""
        self.policy._script = list(texts)

    def decoded(self, ids: Sequence[int]) -> str:
        return str(self.policy.tokenizer().decode(list(ids), skip_special_tokens=True))


@contextlib.contextmanager
def served_gateway() -> Iterator[Served]:
    """A gateway on a loopback port; the session's caps are ample."""
    policy = ScriptedPolicy(build_tokenizer(), [])
    gateway = Gateway()
    session = gateway.open_session(SessionSettings(
        policy=policy, temperature=1.0, seed=11, max_tokens_per_turn=200,
        max_total_tokens=20_000))
    with GatewayServer(gateway) as server:
        yield Served(server, session, policy)


def assert_extends(earlier_prompt: Sequence[int], earlier_completion: Sequence[int],
                   later_prompt: Sequence[int]) -> None:
    """The later prompt is the earlier prompt and its sampled ids, then more: the
    trajectory keeps the exact sampled ids (nothing re-tokenized)."""
    head = [*earlier_prompt, *earlier_completion]
    assert list(later_prompt[: len(head)]) == head
