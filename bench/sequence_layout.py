"""Trajectory layout: one full prompt per step (before) against one sequence per episode.

For episodes of 5, 20 and 50 turns (an opening context, then per turn an observation and
an action, each prompt extending the one before, as the chat harness renders them when
the contract keeps every turn) it measures:

- bytes stored per episode in PostgreSQL (``pg_total_relation_size`` of the tables after
  the episodes went in, TOAST and indexes included, divided by the episodes): the
  per-step layout of migrations 0001-0016 (each ``step`` row holds its prompt, action,
  mask and logprobs) against migration 0018's (one ``trajectory_sequence`` row, steps with
  offsets), each with its step rows' other columns;
- seconds per GRPO update (``learning_loop.update.update_policy``, tiny Qwen2, CPU) on the
  same turns: trained as separate samples (one forward per turn over its whole prompt,
  today's learner before this change) against packed (one forward per trajectory).

and prints each figure with the ratio before / after.

    .venv/bin/python bench/sequence_layout.py              # starts its own PostgreSQL
    .venv/bin/python bench/sequence_layout.py --database-url postgresql://...  # an existing one
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import psycopg
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, Qwen2Config

from learning_loop.batch import TrainingSample
from learning_loop.update import UpdateSettings, build_optimizer, update_policy
from triloop.run_config import OptimizerConfig, UpdateConfig
from triloop.token_sequence import TurnTokens, pack_turns

TURNS = (5, 20, 50)
OPENING, OBSERVATION, ACTION = 96, 24, 16  # tokens

PER_STEP_DDL = """
CREATE TEMP TABLE old_step (
    trajectory_id varchar, "index" int, prompt_token_ids int4[], action_token_ids int4[],
    action_mask int2[], behaviour_logprobs float8[], observation varchar, action_text varchar,
    feedback jsonb, reward float8, done bool, PRIMARY KEY (trajectory_id, "index"));
"""
SEQUENCE_DDL = """
CREATE TEMP TABLE new_step (
    trajectory_id varchar, "index" int, prompt_start int4, observation_start int4,
    action_start int4, action_end int4, observation varchar, action_text varchar,
    feedback jsonb, reward float8, done bool, PRIMARY KEY (trajectory_id, "index"));
CREATE TEMP TABLE new_sequence (
    trajectory_id varchar PRIMARY KEY, token_ids int4[], action_mask int2[],
    behaviour_logprobs float8[], segment_starts int4[]);
"""


def episode(turns: int, rng: random.Random, vocab: int) -> list[TurnTokens]:
    """Turns whose prompts extend each other: opening, then observation + action per turn."""
    def tokens(n: int) -> list[int]:
        return [rng.randrange(4, vocab) for _ in range(n)]

    context = tokens(OPENING)
    out: list[TurnTokens] = []
    for k in range(turns):
        if k:
            context = context + tokens(OBSERVATION)
        action = tokens(ACTION)
        out.append(TurnTokens(list(context), action, [-rng.random() * 3 for _ in action]))
        context = context + action
    return out


def stored_bytes(conn: psycopg.Connection[tuple[object, ...]], episodes: list[list[TurnTokens]]
                 ) -> tuple[float, float]:
    """Bytes per episode in the per-step layout and in the sequence layout."""
    conn.execute(PER_STEP_DDL)
    conn.execute(SEQUENCE_DDL)
    text = ("observation", "action", '{"finish_reason": "stop"}')
    with conn.cursor() as cur:
        for turns in episodes:
            tid = uuid.uuid4().hex
            cur.executemany(
                "INSERT INTO old_step VALUES (%s, %s, %s::int4[], %s::int4[], %s::int2[],"
                " %s::float8[], %s, %s, %s::jsonb, 0.0, false)",
                [(tid, i, list(t.prompt_token_ids), list(t.action_token_ids),
                  [0] * len(t.prompt_token_ids) + [1] * len(t.action_token_ids),
                  list(t.behaviour_logprobs), *text) for i, t in enumerate(turns)])
            sequence, offsets = pack_turns(turns)
            cur.execute("INSERT INTO new_sequence VALUES (%s, %s::int4[], %s::int2[],"
                        " %s::float8[], %s::int4[])",
                        (tid, sequence.token_ids, sequence.action_mask,
                         sequence.behaviour_logprobs, sequence.segment_starts))
            cur.executemany(
                "INSERT INTO new_step VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s::jsonb, 0.0,"
                " false)",
                [(tid, i, at.prompt_start, at.observation_start, at.action_start, at.action_end,
                  *text) for i, at in enumerate(offsets)])
    sizes: dict[str, int] = {}
    for name in ("old_step", "new_step", "new_sequence"):
        row = conn.execute(f"SELECT pg_total_relation_size('{name}')").fetchone()
        sizes[name] = int(str(row[0])) if row else 0
    conn.execute("DROP TABLE old_step, new_step, new_sequence")
    n = len(episodes)
    return sizes["old_step"] / n, (sizes["new_step"] + sizes["new_sequence"]) / n


def tiny_model(max_positions: int) -> PreTrainedModel:
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_positions,
    )
    model: PreTrainedModel = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
    return model


def samples_of(episodes: list[list[TurnTokens]], *, packed: bool) -> list[TrainingSample]:
    """Each turn a sample; per-step layout: every turn its own trajectory id, so nothing packs."""
    out = []
    for e, turns in enumerate(episodes):
        for k, t in enumerate(turns):
            tid = f"e{e}" if packed else f"e{e}-t{k}"
            out.append(TrainingSample(tid, f"g{e}", "task", 0, tuple(t.prompt_token_ids),
                                      tuple(t.action_token_ids),
                                      tuple(t.behaviour_logprobs), 1.0 if e % 2 else -1.0))
    return out


def update_seconds(episodes: list[list[TurnTokens]], *, packed: bool, repeats: int) -> float:
    """Best wall seconds of one update over these episodes' turns."""
    longest = max(len(t.prompt_token_ids) + len(t.action_token_ids) for e in episodes for t in e)
    model = tiny_model(max(longest + 8, 128))
    optimizer, _ = build_optimizer(model, OptimizerConfig())
    samples = samples_of(episodes, packed=packed)
    settings = UpdateSettings(update=UpdateConfig(micro_batch_size=4))
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        update_policy(model, optimizer, [replace(s) for s in samples], settings, policy_version=0)
        best = min(best, time.perf_counter() - started)
    return best


@contextmanager
def postgres(url: str | None) -> Iterator[str]:
    """The given server, or a throwaway one started for this run."""
    if url:
        yield url
        return
    from triloop.devstack.postgres import start_postgres
    from triloop.devstack.processes import free_port, stop_recorded

    with tempfile.TemporaryDirectory(prefix="triloop-seqbench-") as tmp:
        home, port, password = Path(tmp), free_port(), uuid.uuid4().hex
        proc = start_postgres(home / "pg", port=port, run_dir=home / "run",
                              log_dir=home / "logs", owner_password=password, durable=False)
        try:
            yield f"postgresql://postgres:{password}@127.0.0.1:{port}/triloop"
        finally:
            stop_recorded(proc.pid_path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default=None, help="an existing PostgreSQL")
    parser.add_argument("--episodes", type=int, default=32,
                        help="episodes stored per size (many, so 8 KiB pages average out)")
    parser.add_argument("--trained", type=int, default=2, help="episodes per timed update")
    parser.add_argument("--repeats", type=int, default=2, help="timed updates (best counts)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rng = random.Random(0)
    print(f"opening {OPENING} tokens, then per turn {OBSERVATION} observation + {ACTION} action"
          " tokens; before = one full prompt per step, after = one sequence per episode")
    header = (f"{'turns':>5} {'bytes/episode before':>21} {'after':>10} {'ratio':>7}"
              f" {'update s before':>16} {'after':>8} {'ratio':>7}")
    print(header)
    with postgres(args.database_url) as url, psycopg.connect(url) as conn:
        for turns in TURNS:
            episodes = [episode(turns, rng, 512) for _ in range(args.episodes)]
            before_b, after_b = stored_bytes(conn, episodes)
            trained = episodes[: args.trained]
            before_s = update_seconds(trained, packed=False, repeats=args.repeats)
            after_s = update_seconds(trained, packed=True, repeats=args.repeats)
            print(f"{turns:>5} {before_b:>21,.0f} {after_b:>10,.0f} {before_b / after_b:>6.1f}x"
                  f" {before_s:>16.3f} {after_s:>8.3f} {before_s / after_s:>6.1f}x", flush=True)


if __name__ == "__main__":
    main()
