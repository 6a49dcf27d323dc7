"""Black-box trajectories: bytes per episode, one full prompt per model call against the
gateway session's one sequence.

An agent (the official ``openai`` client, chat completions) plays sessions of 5, 20 and 50
model calls through the real gateway (``GatewayServer``, a scripted policy on the tiny
tokenizer, so the cost is the record's, not sampling's). It keeps its whole history: a long
system prompt and the task, then per call the model's answer and a tool result. A second
agent does the same but compacts its history once, half-way (it replaces the conversation
so far with a summary), which is where a new segment must start and nowhere else.

For each session it stores, in PostgreSQL, both layouts of the same calls and prints the
bytes per episode (``pg_total_relation_size`` of the tables, TOAST and indexes included,
after ``--episodes`` sessions per size, divided by them) with the ratio:

- before: one row per model call holding its full prompt, sampled ids, mask and logprobs
  (the per-step layout of migrations 0001-0016, ``bench/sequence_layout.py``'s ``old_step``;
  it is how the gateway's record held each call until the session spliced its calls onto
  one sequence, though since migration 0018 the store re-packed those prompts at write
  time);
- after: the session's one sequence as the store writes it (``trajectory_sequence`` plus
  the step rows with their offsets), checked to be exactly the sequence the session
  spliced together call by call.

It also prints the token ids each layout holds for the first session (the sum of the
calls' prompts and answers, which the session's record used to hold, against the
sequence's length, which it holds now) and its segments.

    .venv/bin/python bench/black_box_bytes.py              # starts its own PostgreSQL
    .venv/bin/python bench/black_box_bytes.py --database-url postgresql://...
"""

from __future__ import annotations

import argparse
import random
from typing import Any

import psycopg
from openai import OpenAI
from transformers import PreTrainedTokenizerBase

from bench.sequence_layout import postgres, stored_bytes
from execution_loop.command_agent import episode_steps
from execution_loop.gateway.http_server import GatewayServer
from execution_loop.gateway.session import AgentSession, Gateway, SessionSettings
from execution_loop.inference.base import (
    FINISH_STOP,
    Generation,
    decode_action,
)
from learning_loop.tiny_model import build_tokenizer
from triloop.token_sequence import TurnTokens, pack_turns

CALLS = (5, 20, 50)
SYSTEM_WORDS, RESULT_WORDS = 400, 40  # the system prompt's and each tool result's words


class ScriptedPolicy:
    """Answers every call with a short tool call (ids + end-of-turn), logprob -0.5."""

    checkpoint_id = "bench-scripted"

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self._tokenizer = tokenizer
        self._calls = 0

    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self._tokenizer

    def generate(self, prompt_token_ids: list[int], *, max_new_tokens: int,
                 **_: Any) -> Generation:
        del prompt_token_ids  # scripted: the answer never depends on the prompt
        self._calls += 1
        text = f'<tool_call>{{"name": "python", "arguments": {{"code": "print({self._calls})"}}}}'
        ids = [*self._tokenizer(text, add_special_tokens=False).input_ids,
               self._tokenizer.eos_token_id][:max_new_tokens]
        return Generation(ids, [-0.5] * len(ids), decode_action(self._tokenizer, ids),
                          FINISH_STOP)


def words(rng: random.Random, n: int) -> str:
    return " ".join("".join(rng.choice("abcdefghij") for _ in range(rng.randint(2, 7)))
                    for _ in range(n))


def play(calls: int, rng: random.Random, *, compact: bool) -> AgentSession:
    """One agent session of ``calls`` model calls through the HTTP gateway."""
    gateway = Gateway()
    session = gateway.open_session(SessionSettings(
        policy=ScriptedPolicy(build_tokenizer()), temperature=1.0, seed=rng.randrange(2**31),
        max_tokens_per_turn=256, max_total_tokens=10**7))
    opening: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. " + words(rng, SYSTEM_WORDS)},
        {"role": "user", "content": "Task: make the tests pass. " + words(rng, 30)}]
    history = list(opening)
    with GatewayServer(gateway) as server:
        client = OpenAI(base_url=f"{server.session_url(session.id)}/v1", api_key=session.id)
        for k in range(calls):
            if compact and k == calls // 2:  # the agent replaces its history with a summary
                history = [*opening, {"role": "user", "content": "Summary of the work so far: "
                                      + words(rng, 60)}]
            answer = client.chat.completions.create(model="policy", messages=history)  # type: ignore[arg-type]
            history += [{"role": "assistant", "content": answer.choices[0].message.content},
                        {"role": "user", "content": "Tool result: " + words(rng, RESULT_WORDS)}]
        gateway.close_session(session.id)
    return session


def recorded_turns(session: AgentSession) -> list[TurnTokens]:
    """The session's main-loop calls as the store receives them; checks that the store's
    packing is exactly the sequence the session spliced together as the calls came in."""
    steps = episode_steps(session, [])
    turns = [TurnTokens(s.prompt_token_ids, s.action_token_ids, s.behaviour_logprobs)
             for s in steps]
    sequence, _ = pack_turns(turns)
    if sequence != session.trajectory.sequence:
        raise SystemExit("the store's packing differs from the session's own sequence")
    return turns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default=None, help="an existing PostgreSQL")
    parser.add_argument("--episodes", type=int, default=16,
                        help="sessions stored per size (several, so 8 KiB pages average out)")
    args = parser.parse_args()
    rng = random.Random(0)
    print("an openai-client agent through the gateway; before = one full prompt per model"
          " call, after = the session's one sequence (trajectory_sequence + step offsets)")
    print(f"{'agent':<14} {'calls':>5} {'segments':>8} {'ids held before':>15} {'after':>7}"
          f" {'bytes/episode before':>21} {'after':>9} {'ratio':>7}")
    with postgres(args.database_url) as url, psycopg.connect(url) as conn:
        for compact in (False, True):
            for calls in CALLS:
                sessions = [play(calls, rng, compact=compact) for _ in range(args.episodes)]
                episodes = [recorded_turns(s) for s in sessions]
                before_b, after_b = stored_bytes(conn, episodes)
                held_before = sum(len(t.prompt_token_ids) + len(t.action_token_ids)
                                  for t in episodes[0])
                sequence = sessions[0].trajectory.sequence
                print(f"{'compacts once' if compact else 'keeps history':<14} {calls:>5}"
                      f" {len(sequence.segment_starts):>8} {held_before:>15,}"
                      f" {len(sequence.token_ids):>7,} {before_b:>21,.0f} {after_b:>9,.0f}"
                      f" {before_b / after_b:>6.1f}x", flush=True)


if __name__ == "__main__":
    main()
