"""The harness: renders a multi-turn episode with the model's chat template as token ids.

A conversation is the optional system prompt and the initial observation (always kept),
then turns of (the model's action, the environment's reply). The context rule keeps the
last K turns (K = 0 keeps all). Each message is rendered as ``header + content + footer``
where header and footer are what the model's own chat template puts around a message of
that role at that position (found by rendering with a sentinel content and diffing
against the shorter conversation). Template text is tokenized normally; environment text
is tokenized with special tokens split, so an observation cannot forge a role marker; the
model's actions are the stored sampled ids, never re-tokenized. The action mask is 1
exactly on those stored ids and 0 on everything the template or the environment wrote.
If an action ends with the token the footer starts with (the model's own end-of-turn),
that token is not added a second time.

Tools (a contract's JSON-schema functions, ``execution_loop.tool_calls``) go to every
``apply_chat_template`` call as ``tools=`` when the template renders them; a template
that ignores them gets them as text at the head of the system message instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from jinja2 import TemplateError
from transformers import PreTrainedTokenizerBase

from execution_loop.tool_calls import function_schemas, tools_system_text
from triloop.contracts import ToolSpec

SYSTEM, USER, ASSISTANT = "system", "user", "assistant"
_SENTINEL = "TRILOOPSENTINELCONTENT"
_PLACEHOLDER = "x"


@dataclass(frozen=True)
class Turn:
    """One model action (as sampled) and the environment's reply to it."""

    action_token_ids: Sequence[int]
    observation: str | None  # None: the conversation ends after this action


class ChatTemplateError(ValueError):
    """The tokenizer's chat template cannot be split into per-message token segments."""


@dataclass(frozen=True)
class _Segment:
    header: tuple[int, ...]
    footer_text: str


def kept_turns(turns: Sequence[Turn], keep_last_turns: int) -> Sequence[Turn]:
    """Apply the context rule: the last ``keep_last_turns`` turns (0 keeps every turn)."""
    if keep_last_turns < 0:
        raise ValueError(f"keep_last_turns must be >= 0, got {keep_last_turns}")
    return turns if keep_last_turns == 0 else turns[-keep_last_turns:]


class ChatHarness:
    """Renders conversations for one tokenizer; caches template segments by role sequence."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        *,
        observation_role: str = USER,
        tools: Sequence[ToolSpec] = (),
    ):
        if not getattr(tokenizer, "chat_template", None):
            raise ChatTemplateError(
                "the tokenizer has no chat_template; set one (triloop's tiny model has one)"
            )
        self.tokenizer = tokenizer
        self.observation_role = observation_role
        self._tools: list[dict[Any, Any] | Callable[..., Any]] | None = (
            list(function_schemas(tools)) if tools else None
        )
        self._tools_text = ""
        if self._tools is not None and not self._template_renders_tools():
            self._tools, self._tools_text = None, tools_system_text(tools)
        self._segments: dict[tuple[str, ...], _Segment] = {}
        self._footers: dict[str, tuple[int, ...]] = {}
        self._preamble: tuple[int, ...] | None = None
        self._preamble_text = ""

    # -- public API -------------------------------------------------------------------------

    def prompt_token_ids(
        self,
        *,
        system: str | None,
        initial_observation: str,
        turns: Sequence[Turn],
        keep_last_turns: int = 0,
    ) -> list[int]:
        """Token ids to feed the policy for its next action under the context rule."""
        system = self._system(system)
        ids, _ = self._render(system, initial_observation, kept_turns(turns, keep_last_turns))
        roles = self._roles(system, kept_turns(turns, keep_last_turns)) + (ASSISTANT,)
        ids.extend(self._segment(roles).header)
        return ids

    def conversation_token_ids_and_mask(
        self,
        *,
        system: str | None,
        initial_observation: str,
        turns: Sequence[Turn],
        keep_last_turns: int = 0,
    ) -> tuple[list[int], list[int]]:
        """The whole conversation as ids and its action mask (1 on sampled ids only)."""
        kept = kept_turns(turns, keep_last_turns)
        return self._render(self._system(system), initial_observation, kept)

    # -- rendering --------------------------------------------------------------------------

    def _template_renders_tools(self) -> bool:
        probe = [{"role": USER, "content": _PLACEHOLDER}]
        try:
            with_tools = self._apply(probe, generation_prompt=False)
            self._tools, tools = None, self._tools
            without = self._apply(probe, generation_prompt=False)
            self._tools = tools
        except (TemplateError, ValueError, TypeError):
            return False
        return with_tools != without

    def _system(self, system: str | None) -> str | None:
        """The system message, led by the tools' text when the template does not show them."""
        if not self._tools_text:
            return system
        return self._tools_text if system is None else f"{self._tools_text}\n\n{system}"

    def _roles(self, system: str | None, turns: Sequence[Turn]) -> tuple[str, ...]:
        roles: list[str] = [SYSTEM] if system is not None else []
        roles.append(USER)
        for turn in turns:
            roles.append(ASSISTANT)
            if turn.observation is not None:
                roles.append(self.observation_role)
        return tuple(roles)

    def _render(
        self, system: str | None, initial_observation: str, turns: Sequence[Turn]
    ) -> tuple[list[int], list[int]]:
        for turn in turns[:-1]:
            if turn.observation is None:
                raise ValueError("only the last turn may lack an observation")
        ids = list(self._preamble_ids())
        mask = [0] * len(ids)
        roles: list[str] = []

        def add_text_message(role: str, content: str) -> None:
            roles.append(role)
            segment = self._segment(tuple(roles))
            piece = [*segment.header, *self._content_ids(content), *self._footer(segment)]
            ids.extend(piece)
            mask.extend([0] * len(piece))

        if system is not None:
            add_text_message(SYSTEM, system)
        add_text_message(USER, initial_observation)
        for turn in turns:
            roles.append(ASSISTANT)
            segment = self._segment(tuple(roles))
            action = [int(t) for t in turn.action_token_ids]
            footer = self._footer(segment)
            # The model's own end-of-turn token is part of its action, not of the template.
            if action and footer and action[-1] == footer[0]:
                footer = footer[1:]
            ids.extend(segment.header)
            mask.extend([0] * len(segment.header))
            ids.extend(action)
            mask.extend([1] * len(action))
            ids.extend(footer)
            mask.extend([0] * len(footer))
            if turn.observation is not None:
                add_text_message(self.observation_role, turn.observation)
        return ids, mask

    def _apply(self, messages: list[dict[str, str]], *, generation_prompt: bool) -> str:
        text: Any = self.tokenizer.apply_chat_template(
            messages, tools=self._tools, tokenize=False, add_generation_prompt=generation_prompt
        )
        if not isinstance(text, str):
            raise ChatTemplateError("apply_chat_template(tokenize=False) did not return text")
        return text

    def _preamble_ids(self) -> tuple[int, ...]:
        """What the template writes before any message (e.g. BOS); empty if it needs one."""
        if self._preamble is None:
            try:
                self._preamble_text = self._apply([], generation_prompt=False)
            except (TemplateError, IndexError, KeyError, ValueError):
                self._preamble_text = ""
            self._preamble = tuple(self._template_ids(self._preamble_text))
        return self._preamble

    def _segment(self, roles: tuple[str, ...]) -> _Segment:
        """Header and footer around the last message of a conversation with these roles."""
        cached = self._segments.get(roles)
        if cached is not None:
            return cached
        self._preamble_ids()
        earlier = [{"role": r, "content": _PLACEHOLDER} for r in roles[:-1]]
        before = self._apply(earlier, generation_prompt=False) if earlier else self._preamble_text
        with_last = self._apply(
            [*earlier, {"role": roles[-1], "content": _SENTINEL}], generation_prompt=False
        )
        if not with_last.startswith(before) or with_last.count(_SENTINEL) != 1:
            raise ChatTemplateError(
                f"the chat template does not render roles {list(roles)} by appending to the "
                "shorter conversation, so the harness cannot stitch stored token ids"
            )
        header, footer = with_last[len(before) :].split(_SENTINEL)
        if roles[-1] == ASSISTANT and earlier:
            prompt = self._apply(earlier, generation_prompt=True)
            if prompt[len(before) :] != header:
                raise ChatTemplateError(
                    "the template's generation prompt differs from the header it writes for "
                    f"an assistant message ({prompt[len(before) :]!r} vs {header!r})"
                )
        segment = _Segment(header=tuple(self._template_ids(header)), footer_text=footer)
        self._segments[roles] = segment
        return segment

    def _footer(self, segment: _Segment) -> tuple[int, ...]:
        footer = self._footers.get(segment.footer_text)
        if footer is None:
            footer = tuple(self._template_ids(segment.footer_text))
            self._footers[segment.footer_text] = footer
        return footer

    def _template_ids(self, text: str) -> list[int]:
        if not text:
            return []
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)

    def _content_ids(self, text: str) -> list[int]:
        if not text:
            return []
        encoded = self.tokenizer(text, add_special_tokens=False, split_special_tokens=True)
        return list(encoded.input_ids)


def prompt_token_ids(
    tokenizer: PreTrainedTokenizerBase,
    *,
    system: str | None,
    initial_observation: str,
    turns: Sequence[Turn],
    keep_last_turns: int = 0,
) -> list[int]:
    """Token ids for the policy's next action (see ``ChatHarness.prompt_token_ids``)."""
    return ChatHarness(tokenizer).prompt_token_ids(
        system=system,
        initial_observation=initial_observation,
        turns=turns,
        keep_last_turns=keep_last_turns,
    )


def conversation_token_ids_and_mask(
    tokenizer: PreTrainedTokenizerBase,
    *,
    system: str | None,
    initial_observation: str,
    turns: Sequence[Turn],
    keep_last_turns: int = 0,
) -> tuple[list[int], list[int]]:
    """A whole conversation's ids and action mask (1 exactly on the model's sampled ids)."""
    return ChatHarness(tokenizer).conversation_token_ids_and_mask(
        system=system,
        initial_observation=initial_observation,
        turns=turns,
        keep_last_turns=keep_last_turns,
    )
