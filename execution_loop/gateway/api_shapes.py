"""The three model APIs the gateway speaks, reduced to one request shape and back.

A black-box agent talks OpenAI Chat Completions (``POST /v1/chat/completions``), OpenAI
Responses (``POST /v1/responses``) or Anthropic Messages (``POST /v1/messages``). Each
request becomes a ``ModelRequest``: the conversation as plain ``(role, text)`` messages
(system, user, assistant, tool), the token cap and temperature the agent asked for, and
its metadata. The generated text goes back in the shape of the API that asked.

What is reduced away, on purpose: content parts other than text (images, files) are
refused; tool calls and tool results are kept as text (a tool call as its JSON, a tool
result as the text of a ``tool`` message), so the model sees what the agent sent. Tool
definitions (``tools``, in each API's form) are appended to the system prompt as one
line per tool of compact JSON after ``TOOLS_HEADER``; the model's answer comes back as
text (no tool-call parsing).
Options that would change what is sampled (``n`` > 1, ``logit_bias``, stop strings) are
refused rather than ignored, as triloop's own inference server does.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

CHAT_COMPLETIONS, RESPONSES, MESSAGES = "chat.completions", "responses", "messages"
SYSTEM, USER, ASSISTANT, TOOL = "system", "user", "assistant", "tool"
_OPENAI_ROLES = {"system": SYSTEM, "developer": SYSTEM, "user": USER, "assistant": ASSISTANT,
                 "tool": TOOL, "function": TOOL}
_TEXT_PARTS = frozenset({"text", "input_text", "output_text"})
TOOLS_HEADER = "Tools you may call (JSON, one per line):"


class RequestShapeError(ValueError):
    """A request the gateway cannot turn into a prompt; the message names the field."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class ChatMessage:
    """One message of the conversation as text."""

    role: str  # system | user | assistant | tool
    content: str


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

    @property
    def system_prompt(self) -> str | None:
        """The text of the system messages, joined (None when there are none)."""
        texts = [m.content for m in self.messages if m.role == SYSTEM]
        return "\n".join(texts) if texts else None


@dataclass(frozen=True)
class Completion:
    """The gateway's answer, before it is put into an API's shape."""

    text: str
    finish_reason: str  # "stop" or "length"
    prompt_tokens: int
    completion_tokens: int
    kind: str  # the request kind the gateway recorded
    call_index: int


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
        elif kind == "tool_use":  # Anthropic: the model's tool call, kept as its JSON
            texts.append(json.dumps({"name": part.get("name"), "input": part.get("input")}))
        elif kind == "tool_result":  # Anthropic: a tool's output inside a user message
            texts.append(_text_of(part.get("content"), f"{where}[{number}].content"))
        else:
            raise RequestShapeError(
                f"{where}[{number}] is a {kind!r} part; the gateway passes text only",
                param=where,
            )
    return "\n".join(texts)


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


def _with_tools(messages: list[ChatMessage], tools: Any) -> list[ChatMessage]:
    """The tool definitions appended to the (first) system message, so the model sees them."""
    if not tools:
        return messages
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise RequestShapeError("tools must be a list of objects", param="tools")
    lines = [json.dumps(t.get("function", t), sort_keys=True, separators=(",", ":"))
             for t in tools]
    text = "\n".join([TOOLS_HEADER, *lines])
    if messages and messages[0].role == SYSTEM:
        return [ChatMessage(SYSTEM, f"{messages[0].content}\n\n{text}"), *messages[1:]]
    return [ChatMessage(SYSTEM, text), *messages]


def _refuse_sampling_options(body: Mapping[str, Any]) -> None:
    if body.get("n", 1) not in (1, None):
        raise RequestShapeError("n must be 1: one episode samples one answer", param="n")
    for name in ("logit_bias", "stop", "stop_sequences"):
        if body.get(name):
            raise RequestShapeError(
                f"{name} is not supported: it would change what was sampled", param=name
            )


def _object(body: Any) -> Mapping[str, Any]:
    if not isinstance(body, dict):
        raise RequestShapeError("the request body must be a JSON object")
    return body


def parse_chat_completions(raw: Any) -> ModelRequest:
    """An OpenAI Chat Completions request."""
    body = _object(raw)
    _refuse_sampling_options(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestShapeError("messages must be a non-empty list", param="messages")
    parsed: list[ChatMessage] = []
    for number, message in enumerate(messages):
        where = f"messages[{number}]"
        role = _OPENAI_ROLES.get(str(message.get("role"))) if isinstance(message, dict) else None
        if role is None:
            raise RequestShapeError(f"{where} has no known role", param=where)
        text = _text_of(message.get("content"), f"{where}.content")
        calls = message.get("tool_calls")
        if calls:
            text = "\n".join([t for t in (text, json.dumps(calls)) if t])
        parsed.append(ChatMessage(role, text))
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    return ModelRequest(
        api=CHAT_COMPLETIONS, model=str(body.get("model") or ""),
        messages=tuple(_with_tools(parsed, body.get("tools"))),
        max_tokens=_positive_int(max_tokens, "max_completion_tokens"),
        temperature=_temperature(body.get("temperature")),
        metadata=_metadata(body.get("metadata")), stream=bool(body.get("stream")),
    )


def parse_responses(raw: Any) -> ModelRequest:
    """An OpenAI Responses request (``instructions`` + ``input``)."""
    body = _object(raw)
    _refuse_sampling_options(body)
    parsed: list[ChatMessage] = []
    if body.get("instructions"):
        parsed.append(ChatMessage(SYSTEM, _text_of(body["instructions"], "instructions")))
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise RequestShapeError("input must be a string or a non-empty list", param="input")
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
            call = {"name": item.get("name"), "arguments": item.get("arguments")}
            parsed.append(ChatMessage(ASSISTANT, json.dumps(call)))
        elif kind == "function_call_output":
            parsed.append(ChatMessage(TOOL, _text_of(item.get("output"), f"{where}.output")))
        else:
            raise RequestShapeError(f"{where} is a {kind!r} item; not supported", param=where)
    return ModelRequest(
        api=RESPONSES, model=str(body.get("model") or ""),
        messages=tuple(_with_tools(parsed, body.get("tools"))),
        max_tokens=_positive_int(body.get("max_output_tokens"), "max_output_tokens"),
        temperature=_temperature(body.get("temperature")),
        metadata=_metadata(body.get("metadata")), stream=bool(body.get("stream")),
    )


def parse_anthropic_messages(raw: Any) -> ModelRequest:
    """An Anthropic Messages request (top-level ``system``, ``max_tokens`` required)."""
    body = _object(raw)
    _refuse_sampling_options(body)
    parsed: list[ChatMessage] = []
    if body.get("system"):
        parsed.append(ChatMessage(SYSTEM, _text_of(body["system"], "system")))
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestShapeError("messages must be a non-empty list", param="messages")
    for number, message in enumerate(messages):
        where = f"messages[{number}]"
        role = message.get("role") if isinstance(message, dict) else None
        if role not in (USER, ASSISTANT):
            raise RequestShapeError(f"{where}.role must be 'user' or 'assistant'", param=where)
        parsed.append(ChatMessage(role, _text_of(message.get("content"), f"{where}.content")))
    if body.get("max_tokens") is None:
        raise RequestShapeError("max_tokens is required", param="max_tokens")
    return ModelRequest(
        api=MESSAGES, model=str(body.get("model") or ""),
        messages=tuple(_with_tools(parsed, body.get("tools"))),
        max_tokens=_positive_int(body.get("max_tokens"), "max_tokens"),
        temperature=_temperature(body.get("temperature")),
        metadata=_metadata(body.get("metadata")), stream=bool(body.get("stream")),
    )


PARSERS = {
    CHAT_COMPLETIONS: parse_chat_completions,
    RESPONSES: parse_responses,
    MESSAGES: parse_anthropic_messages,
}


def _usage_openai(done: Completion) -> dict[str, int]:
    return {"prompt_tokens": done.prompt_tokens, "completion_tokens": done.completion_tokens,
            "total_tokens": done.prompt_tokens + done.completion_tokens}


def chat_completion_body(request: ModelRequest, done: Completion) -> dict[str, Any]:
    """An OpenAI ``chat.completion`` object."""
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
        "created": int(time.time()), "model": request.model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": done.text},
                     "logprobs": None, "finish_reason": done.finish_reason}],
        "usage": _usage_openai(done),
        "triloop": {"kind": done.kind, "call": done.call_index},
    }


def responses_body(request: ModelRequest, done: Completion) -> dict[str, Any]:
    """An OpenAI ``response`` object (``incomplete`` when the token cap cut it)."""
    cut = done.finish_reason == "length"
    return {
        "id": f"resp_{uuid.uuid4().hex}", "object": "response", "created_at": int(time.time()),
        "model": request.model, "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "output": [{
            "type": "message", "id": f"msg_{uuid.uuid4().hex}", "role": "assistant",
            "status": "incomplete" if cut else "completed",
            "content": [{"type": "output_text", "text": done.text, "annotations": []}],
        }],
        "output_text": done.text,
        "usage": {"input_tokens": done.prompt_tokens, "output_tokens": done.completion_tokens,
                  "total_tokens": done.prompt_tokens + done.completion_tokens},
        "triloop": {"kind": done.kind, "call": done.call_index},
    }


def anthropic_message_body(request: ModelRequest, done: Completion) -> dict[str, Any]:
    """An Anthropic ``message`` object."""
    return {
        "id": f"msg_{uuid.uuid4().hex}", "type": "message", "role": "assistant",
        "model": request.model, "content": [{"type": "text", "text": done.text}],
        "stop_reason": "max_tokens" if done.finish_reason == "length" else "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": done.prompt_tokens, "output_tokens": done.completion_tokens},
        "triloop": {"kind": done.kind, "call": done.call_index},
    }


BODIES = {
    CHAT_COMPLETIONS: chat_completion_body,
    RESPONSES: responses_body,
    MESSAGES: anthropic_message_body,
}


def error_body(api: str, message: str, *, kind: str, param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    """An error in the asking API's shape (OpenAI's ``error`` object or Anthropic's)."""
    if api == MESSAGES:
        return {"type": "error", "error": {"type": kind, "message": message}}
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
