"""The policy client interface: token ids in, sampled token ids and their logprobs out.

Every backend returns the exact ids it sampled and the log-probability of each under the
distribution it sampled from (the behaviour policy at the request's temperature), so the
learner's importance ratios start at 1.0 and nothing is ever re-tokenized.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from transformers import PreTrainedTokenizerBase

FINISH_STOP = "stop"  # the model emitted an end-of-sequence or stop token (it is included)
FINISH_LENGTH = "length"  # max_new_tokens was reached


@dataclass(frozen=True)
class Generation:
    """One sampled continuation."""

    token_ids: list[int]
    logprobs: list[float]  # log p(token) under the behaviour policy, one per token id
    text: str  # the ids decoded without special tokens
    finish_reason: str  # FINISH_STOP or FINISH_LENGTH


@runtime_checkable
class PolicyClient(Protocol):
    """Samples continuations of a token-id prompt from one checkpoint."""

    checkpoint_id: str

    def generate(
        self,
        prompt_token_ids: list[int],
        *,
        max_new_tokens: int,
        temperature: float,
        seed: int | None,
        stop_token_ids: Sequence[int] = (),
    ) -> Generation:
        """Sample up to ``max_new_tokens`` ids; stops after EOS or any of ``stop_token_ids``."""
        ...

    def tokenizer(self) -> PreTrainedTokenizerBase:
        """The checkpoint's tokenizer (chat template included)."""
        ...


class InferenceError(RuntimeError):
    """The policy could not produce a generation (an infrastructure problem: retry)."""


class PromptTooLongError(ValueError):
    """The prompt plus the requested new tokens do not fit the model's context window.

    Not an ``InferenceError``: retrying the same request cannot succeed; the episode ends
    as truncated instead.
    """

    @classmethod
    def for_lengths(
        cls, prompt_tokens: int, max_new_tokens: int, max_model_len: int
    ) -> PromptTooLongError:
        """The error for a prompt of ``prompt_tokens`` asking for ``max_new_tokens`` more."""
        return cls(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {prompt_tokens + max_new_tokens} tokens ({prompt_tokens} in the prompt, "
            f"{max_new_tokens} in the completion). Keep fewer turns in the context rule or "
            "lower max_tokens_per_turn."
        )


class InferenceServerError(InferenceError):
    """An OpenAI-compatible server refused a request or could not be reached."""

    def __init__(self, server: str, problem: str, *, status_code: int | None = None) -> None:
        where = f"{server} (HTTP {status_code})" if status_code is not None else server
        super().__init__(f"inference server {where}: {problem}")
        self.server = server
        self.problem = problem
        self.status_code = status_code


class InferenceResponseError(InferenceError):
    """A server answered, but not with the fields a token-level rollout needs."""

    def __init__(self, server: str, problem: str) -> None:
        super().__init__(f"inference server {server} returned an unusable response: {problem}")
        self.server = server
        self.problem = problem


def validate_request(
    prompt_token_ids: Sequence[int], max_new_tokens: int, temperature: float
) -> None:
    """Reject arguments no backend can honour, with a message naming the bad value."""
    if not prompt_token_ids:
        raise ValueError("prompt_token_ids is empty: render at least the chat template's prompt")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 means greedy), got {temperature}")


def decode_action(tokenizer: PreTrainedTokenizerBase, token_ids: Sequence[int]) -> str:
    """The text of sampled ids without special tokens: what the environment receives."""
    text = tokenizer.decode(list(token_ids), skip_special_tokens=True)
    if not isinstance(text, str):
        raise TypeError(f"tokenizer.decode returned {type(text).__name__}, expected str")
    return text
