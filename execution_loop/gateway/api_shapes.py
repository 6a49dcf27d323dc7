"""The three model APIs the gateway speaks, reduced to one request shape and back.

A black-box agent talks OpenAI Chat Completions (``POST /v1/chat/completions``), OpenAI
Responses (``POST /v1/responses``) or Anthropic Messages (``POST /v1/messages``). Each
request becomes a ``ModelRequest``: the conversation as plain ``(role, text)`` messages
(system, user, assistant, tool), the token cap and temperature the agent asked for, and
its metadata. The generated text goes back in the shape of the API that asked.

What is reduced away, on purpose: content parts other than text (images, files) are
refused. Tool definitions (``tools``, in each API's form) are appended to the system
prompt as one line per tool of compact JSON after ``TOOLS_HEADER`` and kept as
``ToolSpec``s, so the session can read the model's calls back (``tool_calls``); the
agent's earlier calls come back as structured ``ToolCall``s with their ids (the session
splices the ids it sampled for them) and tool results as ``tool`` messages. Responses
``reasoning`` input items are accepted and dropped: a reasoning the gateway sampled is
in the sampled ids already, and the summary of another model's is no prompt text.
Options that would change what is sampled in ways the gateway cannot record (``n`` > 1,
``logit_bias``, ``top_logprobs``) or cannot enforce (a JSON ``response_format``) are
refused with the API's error rather than ignored. The answers' bodies are in
``api_bodies``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from execution_loop.tool_calls import ToolCall
from triloop.contracts import ToolSpec

CHAT_COMPLETIONS, RESPONSES, MESSAGES = "chat.completions", "responses", "messages"
SYSTEM, USER, ASSISTANT, TOOL = "system", "user", "assistant", "tool"
AUTO, NONE, REQUIRED = "auto", "none", "required"  # tool_choice, in OpenAI's words
_OPENAI_ROLES = {"system": SYSTEM, "developer": SYSTEM, "user": USER, "assistant": ASSISTANT,
                 "tool": TOOL, "function": TOOL}
_TEXT_PARTS = frozenset({"text", "input_text", "output_text"})
TOOLS_HEADER = ('Tools you may call (JSON, one per line), each call written as '
                '<tool_call>{"name": ..., "arguments": {...}}</tool_call>:')
MAX_STOP_SEQUENCES = 16  # OpenAI says 4 and Anthropic more; one limit for both


class RequestShapeError(ValueError):
    """A request the gateway cannot turn into a prompt; the message names the field."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class ChatMessage:
    """One message of the conversation: its text and, for the assistant, its tool calls."""

    role: str  # system | user | assistant | tool
    content: str
    tool_calls: tuple[ToolCall, ...] = ()  # the assistant's calls, in order
    call_ids: tuple[str, ...] = ()  # their ids, as the API named them


@dataclass(frozen=True)
class ModelRequest:
    """What any of the three APIs asked for, in one shape."""

    api: str  # chat.completions | responses | messages
    model: str
    messages: tuple[ChatMessage, ...]
    max_tokens: int | None  # the agent's cap on generated tokens; None: the episode's cap
    temperature: float | None  # recorded; sampling uses the episode's temperature
    metadata: Mapping[str, str] = field(default_factory=dict)
    stream: bool = False
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: str = AUTO  # auto | none | required (a named tool is required too)
    forced_tool: str | None = None  # the tool a named tool_choice requires
    stop: tuple[str, ...] = ()  # stop sequences: the answer ends before the first one
    logprobs: bool = False  # the sampled tokens' logprobs go back with the answer
    previous_response_id: str | None = None  # Responses: the stored turn this continues
    store: bool = True  # Responses: keep this turn for a later previous_response_id

    @property
    def system_prompt(self) -> str | None:
        """The text of the system messages, joined (None when there are none)."""
        texts = [m.content for m in self.messages if m.role == SYSTEM]
        return "\n".join(texts) if texts else None

    @property
    def calls_tools(self) -> bool:
        """Whether the model's answer is read for tool calls."""
        return bool(self.tools) and self.tool_choice != NONE


@dataclass(frozen=True)
class TokenLogprob:
    """One sampled token as the APIs' ``logprobs`` show it."""

    token: str
    logprob: float


@dataclass(frozen=True)
class Completion:
    """The gateway's answer, before it is put into an API's shape."""

    text: str
    finish_reason: str  # "stop", "length" or "tool_calls"
    prompt_tokens: int
    completion_tokens: int
    kind: str  # the request kind the gateway recorded
    call_index: int
    response_id: str = ""  # the answer's id in the asking API's form
    tool_calls: tuple[ToolCall, ...] = ()
    call_ids: tuple[str, ...] = ()
    stop_sequence: str | None = None  # the stop sequence that ended the answer
    logprobs: tuple[TokenLogprob, ...] = ()  # when the request asked for them


def _text_of(content: Any, where: str) -> str:
    """Text of a string or a list of text parts (OpenAI and Anthropic both allow either)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise RequestShapeError(f"{where} must be a string or a list of parts", param=where)
    texts: list[str] = []
    for number, part in enumerate(content):
        if isinstance(part, str):
            texts.append(part)
            continue
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _TEXT_PARTS and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "tool_result":  # Anthropic: a tool's output inside a user message
            texts.append(_text_of(part.get("content"), f"{where}[{number}].content"))
        else:
            raise RequestShapeError(
                f"{where}[{number}] is a {kind!r} part; the gateway passes text only",
                param=where,
            )
    return "\n".join(texts)


def _call(name: Any, arguments: Any, where: str) -> ToolCall:
    """An agent's earlier call; OpenAI sends the arguments as JSON text, Anthropic as JSON."""
    if not isinstance(name, str) or not name:
        raise RequestShapeError(f"{where} has no tool name", param=where)
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments or "{}")
        except ValueError as exc:
            raise RequestShapeError(f"{where}: the arguments are not JSON: {exc}",
                                    param=where) from exc
    if not isinstance(arguments, dict):
        raise RequestShapeError(f"{where}: the arguments must be a JSON object", param=where)
    return ToolCall(name, arguments)


def _positive_int(value: Any, name: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise RequestShapeError(f"{name} must be a positive integer, got {value!r}", param=name)
    return value


def _temperature(value: Any) -> float | None:
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
        raise RequestShapeError(f"temperature must be >= 0, got {value!r}", param="temperature")
    return float(value)


def _metadata(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RequestShapeError("metadata must be an object", param="metadata")
    return {str(k): str(v) for k, v in value.items()}


def _tool_specs(tools: Any) -> tuple[ToolSpec, ...]:
    """The declared tools in any API's form: OpenAI Chat's ``{"function": {...}}``,
    Responses' flat ``{"type": "function", "name", "parameters"}``, Anthropic's
    ``{"name", "input_schema"}``."""
    if not tools:
        return ()
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise RequestShapeError("tools must be a list of objects", param="tools")
    specs = []
    for number, tool in enumerate(tools):
        function = tool.get("function", tool)
        name = function.get("name") if isinstance(function, dict) else None
        schema = function.get("parameters", function.get("input_schema")) or {"type": "object"}
        if not isinstance(name, str) or not name or not isinstance(schema, dict):
            raise RequestShapeError(f"tools[{number}] needs a name and a JSON-schema object",
                                    param=f"tools[{number}]")
        # Built unvalidated: an agent's tool names (dashes, dots) need not be a contract's.
        specs.append(ToolSpec.model_construct(
            name=name, description=str(function.get("description") or ""), parameters=schema))
    return tuple(specs)


def _with_tools(messages: list[ChatMessage], tools: Any) -> list[ChatMessage]:
    """The tool definitions appended to the (first) system message, so the model sees them."""
    if not tools:
        return messages
    lines = [json.dumps(t.get("function", t), sort_keys=True, separators=(",", ":"))
             for t in tools]
    text = "\n".join([TOOLS_HEADER, *lines])
    if messages and messages[0].role == SYSTEM:
        return [ChatMessage(SYSTEM, f"{messages[0].content}\n\n{text}"), *messages[1:]]
    return [ChatMessage(SYSTEM, text), *messages]


def _tool_choice(value: Any, tools: tuple[ToolSpec, ...]) -> tuple[str, str | None]:
    """``(auto|none|required, the named tool)`` from any API's ``tool_choice``."""
    if value is None:
        return AUTO, None
    kind, name = value, None
    if isinstance(value, dict):  # OpenAI {"type": "function", ...}; Anthropic any/tool/...
        kind = value.get("type")
        function = value.get("function")
        name = function.get("name") if isinstance(function, dict) else value.get("name")
        kind = {"function": REQUIRED, "tool": REQUIRED, "any": REQUIRED}.get(str(kind), kind)
        if kind == REQUIRED and value.get("type") in ("function", "tool") and not name:
            raise RequestShapeError("tool_choice names no tool", param="tool_choice")
    if kind not in (AUTO, NONE, REQUIRED):
        raise RequestShapeError(f"tool_choice {value!r} is not auto, none, required or a "
                                "named tool", param="tool_choice")
    if kind == REQUIRED and not tools:
        raise RequestShapeError("tool_choice requires a tool call, but no tools were given",
                                param="tool_choice")
    if name is not None and name not in {t.name for t in tools}:
        raise RequestShapeError(f"tool_choice names {name!r}, which is not among the tools",
                                param="tool_choice")
    return str(kind), name


def _stop(value: Any, name: str) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if (not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops)
            or len(stops) > MAX_STOP_SEQUENCES):
        raise RequestShapeError(f"{name} must be a string or a list of at most "
                                f"{MAX_STOP_SEQUENCES} non-empty strings", param=name)
    return tuple(stops)


def _refuse_sampling_options(body: Mapping[str, Any]) -> None:
    if body.get("n", 1) not in (1, None):
        raise RequestShapeError("n must be 1: one episode samples one answer", param="n")
    if body.get("logit_bias"):
        raise RequestShapeError("logit_bias is not supported: it would change what was "
                                "sampled", param="logit_bias")
    if body.get("top_logprobs"):
        raise RequestShapeError("top_logprobs is not supported: the gateway keeps the logprob "
                                "of the sampled token only", param="top_logprobs")


def _refuse_json_format(value: Any, param: str) -> None:
    """A JSON ``response_format`` is refused: the gateway cannot constrain decoding to a
    schema, and an answer that merely might fit it would be a silent lie."""
    if isinstance(value, dict) and value.get("type", "text") != "text":
        raise RequestShapeError(
            f"{param} {value.get('type')!r} is not supported: the gateway does not constrain "
            "decoding to a JSON schema; ask for text and validate it in the agent",
            param=param)


def _object(body: Any) -> Mapping[str, Any]:
    if not isinstance(body, dict):
        raise RequestShapeError("the request body must be a JSON object")
    return body


def _common(body: Mapping[str, Any], tools: tuple[ToolSpec, ...]) -> dict[str, Any]:
    """The fields every API spells the same way."""
    choice, forced = _tool_choice(body.get("tool_choice"), tools)
    return {"model": str(body.get("model") or ""), "tools": tools, "tool_choice": choice,
            "forced_tool": forced, "temperature": _temperature(body.get("temperature")),
            "metadata": _metadata(body.get("metadata")), "stream": bool(body.get("stream"))}


def _chat_message(message: Any, where: str) -> ChatMessage:
    role = _OPENAI_ROLES.get(str(message.get("role"))) if isinstance(message, dict) else None
    if role is None:
        raise RequestShapeError(f"{where} has no known role", param=where)
    text = _text_of(message.get("content"), f"{where}.content")
    calls, ids = [], []
    for number, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            raise RequestShapeError(f"{where}.tool_calls[{number}] has no function",
                                    param=f"{where}.tool_calls")
        calls.append(_call(function.get("name"), function.get("arguments"),
                           f"{where}.tool_calls[{number}]"))
        ids.append(str(call.get("id") or ""))
    return ChatMessage(role, text, tuple(calls), tuple(ids))


def parse_chat_completions(raw: Any) -> ModelRequest:
    """An OpenAI Chat Completions request."""
    body = _object(raw)
    _refuse_sampling_options(body)
    _refuse_json_format(body.get("response_format"), "response_format")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestShapeError("messages must be a non-empty list", param="messages")
    parsed = [_chat_message(m, f"messages[{k}]") for k, m in enumerate(messages)]
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    tools = _tool_specs(body.get("tools"))
    return ModelRequest(
        api=CHAT_COMPLETIONS, messages=tuple(_with_tools(parsed, body.get("tools"))),
        max_tokens=_positive_int(max_tokens, "max_completion_tokens"),
        stop=_stop(body.get("stop"), "stop"), logprobs=bool(body.get("logprobs")),
        **_common(body, tools),
    )


def _responses_items(items: list[Any]) -> list[ChatMessage]:
    """Responses input items as messages: consecutive ``function_call`` items join the
    assistant message before them (one turn of the model may say something and call)."""
    parsed: list[ChatMessage] = []
    for number, item in enumerate(items):
        where = f"input[{number}]"
        if not isinstance(item, dict):
            raise RequestShapeError(f"{where} must be an object", param=where)
        kind = item.get("type", "message")
        if kind == "message":
            role = _OPENAI_ROLES.get(str(item.get("role")))
            if role is None:
                raise RequestShapeError(f"{where} has no known role", param=where)
            parsed.append(ChatMessage(role, _text_of(item.get("content"), f"{where}.content")))
        elif kind == "function_call":
            call = _call(item.get("name"), item.get("arguments"), where)
            call_id = str(item.get("call_id") or "")
            last = parsed[-1] if parsed else None
            if last is not None and last.role == ASSISTANT:
                parsed[-1] = ChatMessage(ASSISTANT, last.content, (*last.tool_calls, call),
                                         (*last.call_ids, call_id))
            else:
                parsed.append(ChatMessage(ASSISTANT, "", (call,), (call_id,)))
        elif kind == "function_call_output":
            parsed.append(ChatMessage(TOOL, _text_of(item.get("output"), f"{where}.output")))
        elif kind == "reasoning":
            continue  # see the module docstring
        else:
            raise RequestShapeError(f"{where} is a {kind!r} item; not supported", param=where)
    return parsed


def parse_responses(raw: Any) -> ModelRequest:
    """An OpenAI Responses request (``instructions`` + ``input``)."""
    body = _object(raw)
    _refuse_sampling_options(body)
    text = body.get("text")
    _refuse_json_format(text.get("format") if isinstance(text, dict) else None, "text.format")
    parsed: list[ChatMessage] = []
    if body.get("instructions"):
        parsed.append(ChatMessage(SYSTEM, _text_of(body["instructions"], "instructions")))
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise RequestShapeError("input must be a string or a non-empty list", param="input")
    parsed += _responses_items(items)
    previous = body.get("previous_response_id")
    if previous is not None and not isinstance(previous, str):
        raise RequestShapeError("previous_response_id must be a string",
                                param="previous_response_id")
    include = body.get("include") or []
    tools = _tool_specs(body.get("tools"))
    return ModelRequest(
        api=RESPONSES, messages=tuple(_with_tools(parsed, body.get("tools"))),
        max_tokens=_positive_int(body.get("max_output_tokens"), "max_output_tokens"),
        logprobs="message.output_text.logprobs" in include,
        previous_response_id=previous, store=body.get("store") is not False,
        **_common(body, tools),
    )


def _anthropic_message(message: Any, where: str) -> ChatMessage:
    role = message.get("role") if isinstance(message, dict) else None
    if role not in (USER, ASSISTANT):
        raise RequestShapeError(f"{where}.role must be 'user' or 'assistant'", param=where)
    content = message.get("content")
    blocks = content if isinstance(content, list) else [content]
    uses = [b for b in blocks if isinstance(b, dict) and b.get("type") == "tool_use"]
    rest = [b for b in blocks if not (isinstance(b, dict) and b.get("type") == "tool_use")]
    text = _text_of(rest if isinstance(content, list) else content, f"{where}.content")
    calls = tuple(_call(b.get("name"), b.get("input"), f"{where}.content") for b in uses)
    return ChatMessage(role, text, calls, tuple(str(b.get("id") or "") for b in uses))


def parse_anthropic_messages(raw: Any, *, counting: bool = False) -> ModelRequest:
    """An Anthropic Messages request (top-level ``system``, ``max_tokens`` required unless
    ``counting`` tokens)."""
    body = _object(raw)
    _refuse_sampling_options(body)
    parsed: list[ChatMessage] = []
    if body.get("system"):
        parsed.append(ChatMessage(SYSTEM, _text_of(body["system"], "system")))
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestShapeError("messages must be a non-empty list", param="messages")
    parsed += [_anthropic_message(m, f"messages[{k}]") for k, m in enumerate(messages)]
    if body.get("max_tokens") is None and not counting:
        raise RequestShapeError("max_tokens is required", param="max_tokens")
    tools = _tool_specs(body.get("tools"))
    return ModelRequest(
        api=MESSAGES, messages=tuple(_with_tools(parsed, body.get("tools"))),
        max_tokens=_positive_int(body.get("max_tokens"), "max_tokens"),
        stop=_stop(body.get("stop_sequences"), "stop_sequences"), **_common(body, tools),
    )


PARSERS = {
    CHAT_COMPLETIONS: parse_chat_completions,
    RESPONSES: parse_responses,
    MESSAGES: parse_anthropic_messages,
}
