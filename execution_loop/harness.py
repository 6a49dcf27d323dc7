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

That stitching needs a *prefix-stable* template: each turn's prompt, plus the action, is
the start of the next turn's prompt. Most templates are. A reasoning template (Qwen3's) is
not: it renders earlier assistant turns without their ``<think>`` block, and may write an
empty think block into the generation prompt only. For such a template every prompt is
rendered from the template and the whole history, exactly as a chat server would feed
it (``rendered`` path): the history's contents go in as sentinels, environment text is
tokenized with special tokens split, an action the template shows verbatim is spliced in
as its stored ids, and an action the template rewrote is tokenized as rewritten. Such a
prompt then does not extend the one before, and the trajectory layout
(``triloop.token_sequence``) opens a new segment there, so each action is trained on the
prompt it was sampled from. Which path a template takes is probed once per harness (with
and without a system message) on a short conversation whose actions hold a think block.

Tools (a contract's JSON-schema functions, ``execution_loop.tool_calls``) go to every
``apply_chat_template`` call as ``tools=`` when the template renders them; a template
that ignores them gets them as text at the head of the system message instead.
``template_options`` (e.g. ``{"enable_thinking": False}``) go to every call, too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jinja2 import TemplateError
from transformers import PreTrainedTokenizerBase

from execution_loop.tool_calls import function_schemas, tools_system_text
from triloop.contracts import ToolSpec

SYSTEM, USER, ASSISTANT = "system", "user", "assistant"
_SENTINEL = "TRILOOPSENTINELCONTENT"
_PLACEHOLDER = "x"
# An action as a reasoning model writes it: a template that strips think blocks from the
# history shows it differently later than right after the generation prompt.
_REASONING_PROBE = "<think>\nTRILOOPTHOUGHT{index}\n</think>\n\nTRILOOPANSWER{index}"


@dataclass(frozen=True)
class Turn:
    """One model action (as sampled) and the environment's reply to it."""

    action_token_ids: Sequence[int]
    observation: str | None  # None: the conversation ends after this action


class ChatTemplateError(ValueError):
    """The tokenizer's chat template cannot render a conversation the harness can use."""


class _NotStitchable(ChatTemplateError):
    """This role sequence does not render by appending; the rendered path renders it."""


@dataclass(frozen=True)
class Message:
    """One message to render. ``sampled``: the ids the policy sampled for an assistant text
    (spliced in where the template shows the text verbatim); None: tokenize the text."""

    role: str
    text: str
    sampled: tuple[int, ...] | None = None


@dataclass(frozen=True)
class _Segment:
    header: tuple[int, ...]
    footer_text: str


def kept_turns(turns: Sequence[Turn], keep_last_turns: int) -> Sequence[Turn]:
    """Apply the context rule: the last ``keep_last_turns`` turns (0 keeps every turn)."""
    if keep_last_turns < 0:
        raise ValueError(f"keep_last_turns must be >= 0, got {keep_last_turns}")
    return turns if keep_last_turns == 0 else turns[-keep_last_turns:]


def _slot(index: int) -> str:
    """The sentinel standing for message ``index``'s content in a rendering."""
    return f"TRILOOPSENTINEL{index}CONTENT"


class ChatHarness:
    """Renders conversations for one tokenizer; caches template segments by role sequence."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        *,
        observation_role: str = USER,
        tools: Sequence[ToolSpec] = (),
        template_options: Mapping[str, Any] | None = None,
    ):
        if not getattr(tokenizer, "chat_template", None):
            raise ChatTemplateError(
                "the tokenizer has no chat_template; set one (triloop's tiny model has one)"
            )
        self.tokenizer = tokenizer
        self.observation_role = observation_role
        self._options = dict(template_options or {})
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
        self._stable: dict[bool, bool] = {}

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
        kept = kept_turns(turns, keep_last_turns)
        return self.prompt_ids_of(self._messages(system, initial_observation, kept))

    def conversation_token_ids_and_mask(
        self,
        *,
        system: str | None,
        initial_observation: str,
        turns: Sequence[Turn],
        keep_last_turns: int = 0,
    ) -> tuple[list[int], list[int]]:
        """The whole conversation as ids and its action mask (1 on sampled ids only)."""
        system = self._system(system)
        if not self.prefix_stable(with_system=system is not None):
            raise ChatTemplateError(
                "the chat template renders earlier assistant turns differently from the prompt "
                "they were sampled after (it strips <think> blocks, say), so a conversation is "
                "not one token sequence: store each turn's prompt_token_ids and action "
                "(triloop.token_sequence.pack_turns opens a segment where a prompt changes)"
            )
        kept = kept_turns(turns, keep_last_turns)
        return self._stitch(self._messages(system, initial_observation, kept))

    def prompt_ids_of(self, messages: Sequence[Message]) -> list[int]:
        """Ids of these messages followed by the assistant's generation prompt: stitched
        from cached segments for a prefix-stable template, else rendered whole."""
        with_system = bool(messages) and messages[0].role == SYSTEM
        if self.prefix_stable(with_system=with_system):
            try:
                ids, _ = self._stitch(messages)
                roles = (*(m.role for m in messages), ASSISTANT)
                return [*ids, *self._segment(roles).header]
            except _NotStitchable:
                pass  # a role sequence the probe did not cover: render this prompt whole
        return self.rendered_prompt_ids(messages)

    def prefix_stable(self, *, with_system: bool) -> bool:
        """Whether each prompt this template renders, plus the action, starts the next one
        (then a trajectory is one token sequence). Probed once per system presence."""
        stable = self._stable.get(with_system)
        if stable is None:
            stable = self._stable[with_system] = self._probe_prefix_stable(with_system)
        return stable

    def rendered_prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        """The prompt rendered from the template and the whole conversation, as a chat
        server renders it. Environment and system text go in as sentinels and are tokenized
        with special tokens split; an assistant text the template shows verbatim is spliced
        in as its sampled ids, one it rewrote (a think block dropped) is tokenized as shown.
        """
        slots = [k for k, m in enumerate(messages) if m.role != ASSISTANT]
        shown = [{"role": m.role, "content": _slot(k) if m.role != ASSISTANT else m.text}
                 for k, m in enumerate(messages)]
        probe = [{"role": m.role, "content": _slot(k)} for k, m in enumerate(messages)]
        real_chunks = self._split(self._render_text(shown, True), messages, slots)
        probe_chunks = self._split(self._render_text(probe, True), messages, slots)
        bounds = [-1, *slots, len(messages)]
        ids: list[int] = []
        for j, (real, probed) in enumerate(zip(real_chunks, probe_chunks, strict=True)):
            if j:
                ids.extend(self._content_ids(messages[slots[j - 1]].text))
            between = range(bounds[j] + 1, bounds[j + 1])
            ids.extend(self._chunk_ids(real, probed, [(messages[k], _slot(k)) for k in between]))
        return ids

    # -- which path -------------------------------------------------------------------------

    def _probe_prefix_stable(self, with_system: bool) -> bool:
        """Render a short conversation whose actions hold a think block and check the three
        things stitching relies on: the generation prompt appends to the conversation, an
        action follows the generation prompt verbatim, and a message appends to the rest."""
        roles = [*([SYSTEM] if with_system else []), USER, ASSISTANT, self.observation_role,
                 ASSISTANT, self.observation_role]
        conversation = [
            {"role": role, "content": _REASONING_PROBE.format(index=k) if role == ASSISTANT
             else _slot(k)}
            for k, role in enumerate(roles)
        ]
        previous: str | None = None
        for k in range(1, len(conversation) + 1):
            text = self._render_text(conversation[:k], False)
            if previous is not None and not text.startswith(previous):
                return False
            previous = text
            if roles[k - 1] == ASSISTANT:
                continue
            prompt = self._render_text(conversation[:k], True)
            if not prompt.startswith(text):
                return False
            if k < len(conversation) and roles[k] == ASSISTANT:
                answered = self._render_text(conversation[: k + 1], False)
                if not answered.startswith(prompt + conversation[k]["content"]):
                    return False
        return True

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

    def _messages(
        self, system: str | None, initial_observation: str, turns: Sequence[Turn]
    ) -> list[Message]:
        for turn in turns[:-1]:
            if turn.observation is None:
                raise ValueError("only the last turn may lack an observation")
        messages = [Message(SYSTEM, system)] if system is not None else []
        messages.append(Message(USER, initial_observation))
        for turn in turns:
            action = tuple(int(t) for t in turn.action_token_ids)
            messages.append(Message(ASSISTANT, self._action_text(action), action))
            if turn.observation is not None:
                messages.append(Message(self.observation_role, turn.observation))
        return messages

    def _action_text(self, action: Sequence[int]) -> str:
        """What a chat client holds of a sampled action: its text, special tokens dropped."""
        text: Any = self.tokenizer.decode(list(action), skip_special_tokens=True)
        return str(text)

    def _stitch(self, messages: Sequence[Message]) -> tuple[list[int], list[int]]:
        """Header + body + footer per message, from cached segments; the mask is 1 on
        spliced sampled ids. The model's own end-of-turn token is part of its action, so
        the footer does not add it a second time."""
        ids = list(self._preamble_ids())
        mask = [0] * len(ids)
        roles: list[str] = []
        for message in messages:
            roles.append(message.role)
            segment = self._segment(tuple(roles))
            footer = self._footer(segment)
            if message.sampled is not None:
                body = list(message.sampled)
                if body and footer and body[-1] == footer[0]:
                    footer = footer[1:]
            else:
                body = self._content_ids(message.text)
            ids.extend(segment.header)
            mask.extend([0] * len(segment.header))
            ids.extend(body)
            mask.extend([1 if message.sampled is not None else 0] * len(body))
            ids.extend(footer)
            mask.extend([0] * len(footer))
        return ids, mask

    def _split(self, text: str, messages: Sequence[Message], slots: Sequence[int]) -> list[str]:
        """``text`` cut at each non-assistant message's sentinel (each must occur once)."""
        chunks: list[str] = []
        rest = text
        for k in slots:
            count = text.count(_slot(k))
            if count != 1:
                raise ChatTemplateError(
                    f"the chat template renders the content of message {k} "
                    f"({messages[k].role}) {count} times; the harness needs every message's "
                    "content exactly once"
                )
            before, found, rest = rest.partition(_slot(k))
            if not found:
                raise ChatTemplateError(
                    f"the chat template renders message {k} ({messages[k].role}) before the "
                    "messages that come ahead of it"
                )
            chunks.append(before)
        chunks.append(rest)
        return chunks

    def _chunk_ids(
        self, real: str, probed: str, assistants: Sequence[tuple[Message, str]]
    ) -> list[int]:
        """Ids of the text between two environment messages: template text and the
        assistant messages there (``probed``: the same text with their sentinels)."""
        parts = self._cut(probed, [sentinel for _, sentinel in assistants])
        if parts is not None:
            shown = parts[0] + "".join(
                m.text + part for (m, _), part in zip(assistants, parts[1:], strict=True))
            if shown == real:
                ids = self._template_ids(parts[0])
                for (message, _), part in zip(assistants, parts[1:], strict=True):
                    after = self._template_ids(part)
                    if message.sampled is not None:
                        body = list(message.sampled)
                        if body and after and body[-1] == after[0]:
                            after = after[1:]
                    else:
                        body = self._content_ids(message.text)
                    ids.extend([*body, *after])
                return ids
            head, tail = parts[0], parts[-1]
            if (len(parts) == 2 and len(real) >= len(head) + len(tail)
                    and real.startswith(head) and real.endswith(tail)):
                # Rewritten in place (a think block dropped): tokenized as the template shows it.
                rewritten = real[len(head) : len(real) - len(tail)]
                return [*self._template_ids(head), *self._content_ids(rewritten),
                        *self._template_ids(tail)]
        return self._template_ids(real)  # the template moved or dropped an assistant message

    @staticmethod
    def _cut(text: str, sentinels: Sequence[str]) -> list[str] | None:
        """``text`` cut at each sentinel in order, or None unless each occurs exactly once."""
        parts: list[str] = []
        rest = text
        for sentinel in sentinels:
            before, found, rest = rest.partition(sentinel)
            if not found or sentinel in rest or sentinel in before:
                return None
            parts.append(before)
        return [*parts, rest]

    def _render_text(self, conversation: list[dict[str, str]], generation_prompt: bool) -> str:
        """``_apply`` with the template's own failure named as the harness's refusal."""
        try:
            return self._apply(conversation, generation_prompt=generation_prompt)
        except ChatTemplateError:
            raise
        except (TemplateError, ValueError, TypeError, IndexError, KeyError) as exc:
            roles = [m["role"] for m in conversation]
            raise ChatTemplateError(
                f"the chat template fails on a conversation of roles {roles}: {exc}"
            ) from exc

    def _apply(self, messages: list[dict[str, str]], *, generation_prompt: bool) -> str:
        text: Any = self.tokenizer.apply_chat_template(
            messages, tools=self._tools, tokenize=False, add_generation_prompt=generation_prompt,
            **self._options,
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
        before = (self._render_text(earlier, False) if earlier else self._preamble_text)
        with_last = self._render_text(
            [*earlier, {"role": roles[-1], "content": _SENTINEL}], False
        )
        if with_last.count(_SENTINEL) != 1:
            raise ChatTemplateError(
                f"the chat template renders the content of a {roles[-1]} message "
                f"{with_last.count(_SENTINEL)} times; the harness needs it exactly once"
            )
        if not with_last.startswith(before):
            raise _NotStitchable(
                f"the chat template does not render roles {list(roles)} by appending to the "
                "shorter conversation, so the harness cannot stitch stored token ids"
            )
        header, footer = with_last[len(before) :].split(_SENTINEL)
        if roles[-1] == ASSISTANT and earlier:
            prompt = self._render_text(earlier, True)
            if prompt[len(before) :] != header:
                raise _NotStitchable(
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
