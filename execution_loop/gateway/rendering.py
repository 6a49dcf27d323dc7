"""A conversation from an agent's request as the token ids the model is fed.

The same rendering as ``execution_loop.harness.ChatHarness`` (header + content + footer
per message, from the model's own chat template; a template that is not prefix-stable,
such as a reasoning template that strips earlier ``<think>`` blocks, renders each prompt
whole from the conversation), for any sequence of messages. An
assistant message whose text is one the gateway generated in this session is spliced in
as the ids that were sampled, never re-tokenized: that keeps the next prompt an exact
extension of the last prompt + completion, which is what the trajectory rebuild
matches on (where the template rewrote an earlier completion, the rebuild records a
break and starts a new segment). Text is compared as sent and, failing that, with
surrounding whitespace stripped (agents often strip what they received). Other text, the
agent's own included, is tokenized with special tokens split, so no message can forge a
role marker.
``tool`` messages are rendered in the observation role (``user``), which every chat
template accepts. An assistant message with tool calls the gateway sampled is its sampled
ids (found by the calls' ids); calls it did not sample (an agent may write its own
history) are rendered as the model writes calls (``render_tool_calls``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from execution_loop.gateway.api_shapes import ASSISTANT, SYSTEM, TOOL, ChatMessage
from execution_loop.harness import ChatHarness, Message
from execution_loop.tool_calls import render_tool_calls, tool_call_format

SampledLookup = Callable[[ChatMessage], Sequence[int] | None]
"""The sampled ids of an assistant message the gateway generated in this session, or None."""


class MessageRenderer(ChatHarness):
    """Renders arbitrary chat messages to prompt ids, splicing sampled assistant ids."""

    def prompt_ids(self, messages: Sequence[ChatMessage], sampled: SampledLookup) -> list[int]:
        """Ids of the conversation followed by the assistant's generation header."""
        return self.prompt_ids_of([self._message(m, sampled) for m in messages])

    def _message(self, message: ChatMessage, sampled: SampledLookup) -> Message:
        role = self.observation_role if message.role == TOOL else message.role
        if role not in (SYSTEM, ASSISTANT, self.observation_role):
            raise ValueError(f"cannot render a message with role {message.role!r}")
        known = sampled(message) if role == ASSISTANT else None
        content = message.content
        if message.tool_calls and known is None:
            calls = render_tool_calls(message.tool_calls, self.tool_call_format)
            content = f"{content}\n{calls}" if content else calls
        return Message(role, content, None if known is None else tuple(int(t) for t in known))

    @property
    def tool_call_format(self) -> str:
        """The format the model writes tool calls in (from its chat template)."""
        return tool_call_format(getattr(self.tokenizer, "chat_template", None))
