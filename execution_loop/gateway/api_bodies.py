"""The gateway's answers in the shape of the API that asked: OpenAI ``chat.completion``
and ``response`` objects, Anthropic ``message`` objects, and each API's error body.

Ids are derived from the one id the session gave the answer (``Completion.response_id``),
so a streamed answer's events and its final object name the same items.
"""

from __future__ import annotations

import json
import time
from typing import Any

from execution_loop.gateway.api_shapes import (
    CHAT_COMPLETIONS,
    MESSAGES,
    RESPONSES,
    Completion,
    ModelRequest,
    TokenLogprob,
)

# Anthropic's error types by HTTP status (its SDK maps them back to exception classes).
_ANTHROPIC_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                          403: "permission_error", 404: "not_found_error",
                          413: "request_too_large", 429: "rate_limit_error",
                          529: "overloaded_error"}


def response_id(api: str, hex_id: str) -> str:
    """An answer's id in the API's own form."""
    return {CHAT_COMPLETIONS: "chatcmpl-", RESPONSES: "resp_"}.get(api, "msg_") + hex_id


def call_id(api: str, hex_id: str) -> str:
    """A tool call's id in the API's own form."""
    return ("toolu_" if api == MESSAGES else "call_") + hex_id


def message_item_id(done: Completion) -> str:
    """The Responses ``message`` output item's id."""
    return "msg_" + done.response_id.removeprefix("resp_")


def function_item_id(call: str) -> str:
    """The Responses ``function_call`` output item's id (``call_id`` is the call's)."""
    return "fc_" + call.removeprefix("call_")


def openai_logprobs(entries: tuple[TokenLogprob, ...] | list[TokenLogprob]) -> list[dict[str, Any]]:
    """Logprob entries as both OpenAI APIs write them (no alternatives: see api_shapes)."""
    return [{"token": e.token, "logprob": e.logprob, "bytes": list(e.token.encode()),
             "top_logprobs": []} for e in entries]


def _arguments(done: Completion) -> list[str]:
    return [json.dumps(c.arguments) for c in done.tool_calls]


def chat_tool_calls(done: Completion) -> list[dict[str, Any]]:
    """The answer's calls as ``message.tool_calls``."""
    return [{"id": ident, "type": "function",
             "function": {"name": c.name, "arguments": arguments}}
            for ident, c, arguments in zip(done.call_ids, done.tool_calls, _arguments(done),
                                           strict=True)]


def _usage_openai(done: Completion) -> dict[str, int]:
    return {"prompt_tokens": done.prompt_tokens, "completion_tokens": done.completion_tokens,
            "total_tokens": done.prompt_tokens + done.completion_tokens}


def chat_completion_body(request: ModelRequest, done: Completion) -> dict[str, Any]:
    """An OpenAI ``chat.completion`` object."""
    message: dict[str, Any] = {"role": "assistant",
                               "content": done.text if done.text or not done.tool_calls else None}
    if done.tool_calls:
        message["tool_calls"] = chat_tool_calls(done)
    logprobs = ({"content": openai_logprobs(done.logprobs), "refusal": None}
                if request.logprobs else None)
    return {
        "id": done.response_id, "object": "chat.completion",
        "created": int(time.time()), "model": request.model,
        "choices": [{"index": 0, "message": message, "logprobs": logprobs,
                     "finish_reason": done.finish_reason}],
        "usage": _usage_openai(done),
        "triloop": {"kind": done.kind, "call": done.call_index},
    }


def responses_message_item(request: ModelRequest, done: Completion, *,
                           status: str) -> dict[str, Any]:
    """The Responses ``message`` output item holding the answer's text."""
    part: dict[str, Any] = {"type": "output_text", "text": done.text, "annotations": []}
    if request.logprobs:
        part["logprobs"] = openai_logprobs(done.logprobs)
    return {"type": "message", "id": message_item_id(done), "role": "assistant",
            "status": status, "content": [part]}


def responses_function_items(done: Completion) -> list[dict[str, Any]]:
    """The Responses ``function_call`` output items, one per call."""
    return [{"type": "function_call", "id": function_item_id(ident), "call_id": ident,
             "name": c.name, "arguments": arguments, "status": "completed"}
            for ident, c, arguments in zip(done.call_ids, done.tool_calls, _arguments(done),
                                           strict=True)]


def responses_body(request: ModelRequest, done: Completion) -> dict[str, Any]:
    """An OpenAI ``response`` object (``incomplete`` when the token cap cut it)."""
    cut = done.finish_reason == "length"
    status = "incomplete" if cut else "completed"
    output = ([responses_message_item(request, done, status=status)]
              if done.text or not done.tool_calls else [])
    return {
        "id": done.response_id, "object": "response", "created_at": int(time.time()),
        "model": request.model, "status": status,
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "output": output + responses_function_items(done),
        "output_text": done.text, "parallel_tool_calls": True,
        "tool_choice": request.tool_choice if request.forced_tool is None else {
            "type": "function", "name": request.forced_tool},
        "tools": [{"type": "function", "name": t.name, "description": t.description,
                   "parameters": t.parameters, "strict": False} for t in request.tools],
        "previous_response_id": request.previous_response_id,
        "usage": {"input_tokens": done.prompt_tokens, "output_tokens": done.completion_tokens,
                  "total_tokens": done.prompt_tokens + done.completion_tokens,
                  "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens_details": {"reasoning_tokens": 0}},
        "triloop": {"kind": done.kind, "call": done.call_index},
    }


def anthropic_stop_reason(done: Completion) -> str:
    """Why the answer ended, in Anthropic's words."""
    if done.tool_calls:
        return "tool_use"
    if done.stop_sequence is not None:
        return "stop_sequence"
    return "max_tokens" if done.finish_reason == "length" else "end_turn"


def anthropic_content(done: Completion) -> list[dict[str, Any]]:
    """The answer's content blocks: its text, then a ``tool_use`` block per call."""
    blocks: list[dict[str, Any]] = []
    if done.text or not done.tool_calls:
        blocks.append({"type": "text", "text": done.text})
    blocks += [{"type": "tool_use", "id": ident, "name": c.name, "input": c.arguments}
               for ident, c in zip(done.call_ids, done.tool_calls, strict=True)]
    return blocks


def anthropic_message_body(request: ModelRequest, done: Completion) -> dict[str, Any]:
    """An Anthropic ``message`` object."""
    return {
        "id": done.response_id, "type": "message", "role": "assistant",
        "model": request.model, "content": anthropic_content(done),
        "stop_reason": anthropic_stop_reason(done), "stop_sequence": done.stop_sequence,
        "usage": {"input_tokens": done.prompt_tokens, "output_tokens": done.completion_tokens},
        "triloop": {"kind": done.kind, "call": done.call_index},
    }


BODIES = {
    CHAT_COMPLETIONS: chat_completion_body,
    RESPONSES: responses_body,
    MESSAGES: anthropic_message_body,
}


def error_body(api: str, message: str, *, status: int, kind: str, param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    """An error in the asking API's shape: OpenAI's ``error`` object, or Anthropic's
    ``{"type": "error", ...}`` with the error type its SDK expects for the status."""
    if api == MESSAGES:
        anthropic_kind = _ANTHROPIC_ERROR_TYPES.get(status, "api_error")
        return {"type": "error", "error": {"type": anthropic_kind, "message": message}}
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
