"""A conversation from an agent's request as the token ids the model is fed.

The same stitching as ``execution_loop.harness.ChatHarness`` (header + content + footer
per message, from the model's own chat template), for any sequence of messages. An
assistant message whose text is one the gateway generated in this session is spliced in
as the ids that were sampled, never re-tokenized: that keeps the next prompt an exact
extension of the last prompt + completion, which is what the trajectory rebuild
matches on. Text is compared as sent and, failing that, with surrounding whitespace
stripped (agents often strip what they received). Other text, the agent's own included,
is tokenized with special tokens split, so no message can forge a role marker.
``tool`` messages are rendered in the observation role (``user``), which every chat
template accepts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from execution_loop.gateway.api_shapes import ASSISTANT, SYSTEM, TOOL, ChatMessage
from execution_loop.harness import ChatHarness

SampledLookup = Callable[[str], Sequence[int] | None]
"""The sampled ids of a text the gateway generated in this session, or None."""


class MessageRenderer(ChatHarness):
    """Renders arbitrary chat messages to prompt ids, splicing sampled assistant ids."""

    def prompt_ids(self, messages: Sequence[ChatMessage], sampled: SampledLookup) -> list[int]:
        """Ids of the conversation followed by the assistant's generation header."""
        ids = list(self._preamble_ids())
        roles: list[str] = []
        for message in messages:
            role = self.observation_role if message.role == TOOL else message.role
            if role not in (SYSTEM, ASSISTANT, self.observation_role):
                raise ValueError(f"cannot render a message with role {message.role!r}")
            roles.append(role)
            segment = self._segment(tuple(roles))
            footer = self._footer(segment)
            known = sampled(message.content) if role == ASSISTANT else None
            if known is not None:
                body = [int(t) for t in known]
                # The model's own end-of-turn token is part of what it sampled.
                if body and footer and body[-1] == footer[0]:
                    footer = footer[1:]
            else:
                body = self._content_ids(message.content)
            ids.extend([*segment.header, *body, *footer])
        roles.append(ASSISTANT)
        ids.extend(self._segment(tuple(roles)).header)
        return ids
