"""Sampling several requests in one padded batch, each exactly as it would be sampled alone.

A micro-batch is decoded together: prompts are left-padded to one width with an attention
mask, and each row gets its own position ids (counted over its real tokens only), so a row
sees the same positions and keys as it would in a batch of one; the logits differ from an
unbatched forward only by float rounding (different matmul shapes). Each request keeps its
own seeded ``torch.Generator`` and draws its token from its own row with the same calls as
a single-sequence loop, so a seed gives the same random stream batched or not, and the
returned logprob is read from the distribution the token was drawn from. Rows that finish
are dropped from the batch and the KV cache (``batch_select_indices``) so a long request
does not keep paying for short ones.

Temperature 0 is greedy and, as in vLLM, reports logprobs of the untempered distribution.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from execution_loop.inference.base import FINISH_LENGTH, FINISH_STOP


@dataclass(frozen=True)
class Sample:
    """A generation with the detail an OpenAI-compatible server reports."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    stop_reason: int | None  # the stop_token_ids entry that ended it; None for EOS or length
    top_logprobs: list[list[tuple[int, float]]]  # per position, best first; empty if not asked


@dataclass
class SampleRequest:
    """One validated request: what to sample and where its random stream comes from."""

    prompt_token_ids: list[int]
    max_new_tokens: int
    temperature: float
    generator: torch.Generator
    ends: frozenset[int]  # ids that end the sequence (stop ids, plus EOS unless ignored)
    stops: frozenset[int]  # the caller's stop ids: reported as the stop reason
    top_logprobs: int = 0
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    tops: list[list[tuple[int, float]]] = field(default_factory=list)
    finish_reason: str = FINISH_LENGTH
    stop_reason: int | None = None
    # Told the number of tokens so far after each token (the engine's progress report).
    on_token: Callable[[int], None] | None = None

    def result(self) -> Sample:
        """The finished sample."""
        return Sample(self.ids, self.logprobs, self.finish_reason, self.stop_reason, self.tops)

    def take(self, token: int, logprob: float, logp: torch.Tensor | None) -> bool:
        """Record the drawn token and its logprob (``logp``: the row, for top logprobs)."""
        self.ids.append(token)
        self.logprobs.append(logprob)
        if self.top_logprobs > 0 and logp is not None:
            values, indices = torch.topk(logp, min(self.top_logprobs, logp.numel()))
            self.tops.append(list(zip(indices.tolist(), values.tolist(), strict=True)))
        if self.on_token is not None:
            self.on_token(len(self.ids))
        if token in self.ends:
            self.finish_reason = FINISH_STOP
            self.stop_reason = token if token in self.stops else None
            return True
        return len(self.ids) >= self.max_new_tokens


def next_token_logprobs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Log-probabilities of the next token at ``temperature`` (0: the raw distribution)."""
    scaled = logits.float() if temperature == 0 else logits.float() / temperature
    return torch.log_softmax(scaled, dim=-1)


def draw(
    requests: Sequence[SampleRequest], logits: torch.Tensor
) -> tuple[list[bool], torch.Tensor]:
    """Draw one token per request from its row of ``logits``: (finished per row, tokens).

    The log-softmax, the draw and the logprob lookup run on the whole batch (the same
    element-wise operations a single row gets); only the random noise is drawn per row,
    from the request's own generator, so a seed gives the same tokens batched or alone.
    """
    temps = {r.temperature for r in requests}
    scaled = logits.float()
    if len(temps) > 1:
        # x / 1.0 == x exactly, so greedy rows keep the untempered distribution.
        scaled = scaled / torch.tensor([[t if t > 0 else 1.0] for t in
                                        (r.temperature for r in requests)], device=logits.device)
    elif (temperature := temps.pop()) > 0:
        scaled = scaled / temperature
    logp = torch.log_softmax(scaled, dim=-1)
    tokens = logp.argmax(dim=-1)
    sampled = [row for row, r in enumerate(requests) if r.temperature > 0]
    if sampled:
        # torch.multinomial's own one-sample method (exponential race: argmax p / q with
        # q ~ Exp(1), exact), with each row's noise from that request's generator and the
        # division and argmax done once for all rows.
        every = len(sampled) == len(requests)
        probs = (logp if every else logp[sampled]).exp()
        noise = torch.empty_like(probs)
        for i, row in enumerate(sampled):
            noise[i].exponential_(1, generator=requests[row].generator)
        drawn = (probs / noise).argmax(dim=-1)
        if every:
            tokens = drawn
        else:
            tokens[sampled] = drawn
    chosen = logp.gather(-1, tokens[:, None]).squeeze(-1).tolist()
    finished = [request.take(token, logprob, logp[row] if request.top_logprobs else None)
                for row, (request, token, logprob)
                in enumerate(zip(requests, tokens.tolist(), chosen, strict=True))]
    return finished, tokens


@torch.inference_mode()
def sample_batch(
    model: Any, requests: Sequence[SampleRequest], *, cache_name: str, pad_token_id: int
) -> None:
    """Decode every request to its end, filling each one's ids, logprobs and finish reason."""
    device = next(model.parameters()).device
    width = max(len(r.prompt_token_ids) for r in requests)
    rows = [[pad_token_id] * (width - len(r.prompt_token_ids)) + list(r.prompt_token_ids)
            for r in requests]
    masks = [[0] * (width - len(r.prompt_token_ids)) + [1] * len(r.prompt_token_ids)
             for r in requests]
    attention = torch.tensor(masks, device=device)
    # Positions count real tokens only, so a padded row sees the positions it would alone.
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=torch.tensor(rows, device=device), attention_mask=attention,
                position_ids=positions, use_cache=True, logits_to_keep=1)
    active = list(range(len(requests)))  # request index of each row still in the batch
    next_position = positions[:, -1] + 1
    while True:
        finished, drawn = draw([requests[index] for index in active], out.logits[:, -1])
        kept = [row for row, done in enumerate(finished) if not done]
        if not kept:
            return
        cache = getattr(out, cache_name)
        if len(kept) < len(active):
            # Finished rows leave the batch and the KV cache.
            cache.batch_select_indices(torch.tensor(kept, device=device))
            attention, next_position = attention[kept], next_position[kept]
            active = [active[row] for row in kept]
            drawn = drawn[kept]
        tokens = drawn[:, None]
        attention = torch.cat([attention, attention.new_ones((len(active), 1))], dim=-1)
        out = model(input_ids=tokens, attention_mask=attention,
                    position_ids=next_position[:, None], use_cache=True, **{cache_name: cache})
        next_position = next_position + 1
