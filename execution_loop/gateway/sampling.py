"""One answer sampled for the gateway: in chunks while it streams, ended by a stop sequence.

The ``PolicyClient`` samples a whole continuation per call. A streamed answer is sampled
``STREAM_CHUNK_TOKENS`` at a time, each chunk continuing the prompt plus the ids sampled
so far, and its text goes to the agent as each chunk arrives: the agent sees tokens as
they are sampled, not after the answer is done. Sampling in chunks draws from the same
distribution (each token is still sampled given everything before it); chunk ``k > 0``
uses seed ``turn_seed(seed, k)``, so an answer stays reproducible from its call's seed.

Stop sequences are honoured on the sampled ids, never by re-tokenizing: the answer's ids
end with the first token whose text completes a stop sequence (those ids were sampled and
stay in the record, as an end-of-turn token does), and the text returned ends before the
sequence, as both APIs do.

What a stream shows is held back where it might yet become a stop sequence or a tool call
(``hold_back``: the texts that open one), so the agent never sees text that the finished
answer takes back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from execution_loop.episode import turn_seed
from execution_loop.inference.base import (
    FINISH_LENGTH,
    FINISH_STOP,
    PolicyClient,
    PromptTooLongError,
    decode_action,
)

STREAM_CHUNK_TOKENS = 8  # tokens per chunk of a streamed answer


@dataclass(frozen=True)
class SampledAnswer:
    """The ids and logprobs sampled for one call, and the text the agent receives."""

    token_ids: list[int]
    logprobs: list[float]
    text: str  # ends before the stop sequence, when one ended it
    finish_reason: str  # FINISH_STOP or FINISH_LENGTH
    stop_sequence: str | None


def _stop_cut(tokenizer: PreTrainedTokenizerBase, ids: Sequence[int], stops: Sequence[str],
              start: int) -> tuple[int, str] | None:
    """The fewest ids whose text holds a stop sequence, and which; searched from ``start``."""
    if not stops or not any(s in decode_action(tokenizer, ids) for s in stops):
        return None
    for end in range(max(start, 1), len(ids) + 1):
        text = decode_action(tokenizer, ids[:end])
        found = [(text.index(s), s) for s in stops if s in text]
        if found:
            return end, min(found)[1]
    return None  # unreachable: the whole text holds one


def visible_text(text: str, hold_back: Sequence[str]) -> str:
    """The part of a growing answer a stream may show now: up to the first opening of
    anything held back, less a tail that may be one's beginning, less an unfinished
    character."""
    cut = min((text.index(h) for h in hold_back if h in text), default=len(text))
    shown = text[:cut]
    for held in hold_back:
        for length in range(min(len(held) - 1, len(shown)), 0, -1):
            if shown.endswith(held[:length]):
                shown = shown[:-length]
                break
    return shown.rstrip("\ufffd")


def sample_answer(
    policy: PolicyClient,
    prompt: list[int],
    *,
    budget: int,
    temperature: float,
    seed: int,
    stops: Sequence[str] = (),
    on_text: Callable[[str], None] | None = None,
    hold_back: Sequence[str] = (),
) -> SampledAnswer:
    """Sample up to ``budget`` ids; with ``on_text``, in chunks, showing each new text."""
    tokenizer = policy.tokenizer()
    ids: list[int] = []
    logprobs: list[float] = []
    finish, stop, shown, chunk = FINISH_LENGTH, None, "", 0
    while len(ids) < budget:
        left = budget - len(ids)
        try:
            generation = policy.generate(
                prompt + ids, max_new_tokens=left if on_text is None else min(
                    STREAM_CHUNK_TOKENS, left),
                temperature=temperature, seed=seed if chunk == 0 else turn_seed(seed, chunk))
        except PromptTooLongError:
            if chunk == 0:
                raise
            break  # a later chunk reached the context's end: the answer is cut there
        before, chunk = len(ids), chunk + 1
        ids += generation.token_ids
        logprobs += generation.logprobs
        cut = _stop_cut(tokenizer, ids, stops, before)
        if cut is not None:
            del ids[cut[0]:], logprobs[cut[0]:]
            finish, stop = FINISH_STOP, cut[1]
            break
        if generation.finish_reason == FINISH_STOP or not generation.token_ids:
            finish = FINISH_STOP
            break
        if on_text is not None:
            now = visible_text(decode_action(tokenizer, ids), [*stops, *hold_back])
            if now.startswith(shown) and len(now) > len(shown):
                on_text(now[len(shown):])
                shown = now
    text = decode_action(tokenizer, ids)
    if stop is not None:
        text = text[: text.index(stop)]
    return SampledAnswer(ids, logprobs, text, finish, stop)
