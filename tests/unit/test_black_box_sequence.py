"""A gateway session records its main loop as one token sequence, call by call.

Each main-loop call's new tokens are spliced onto the sequence as the call is made; the
call's prompt is read in place from there (a ``TokenSpan``), so a session of T calls holds
its tokens once, not one full prompt per call. A new segment starts only where the agent
rewrote its history. What the store packs from the session's steps is exactly that
sequence.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
from transformers import PreTrainedTokenizerBase

from execution_loop.command_agent import episode_steps, gateway_summary
from execution_loop.gateway.api_shapes import ChatMessage, ModelRequest
from execution_loop.gateway.rebuild import MainCall, SessionTrajectory, rebuild_trajectory
from execution_loop.gateway.session import AgentSession, Gateway, GatewayError, SessionSettings
from execution_loop.inference.base import Generation, InferenceError
from execution_loop.store import StepRow, pack_steps
from learning_loop.tiny_model import build_tokenizer
from tests.gateway_standins import ScriptedPolicy
from triloop.token_sequence import (
    ActionMask,
    SequencePacker,
    TokenSpan,
    TurnTokens,
    marks_only_the_action,
    pack_turns,
    step_action_mask,
)

SYSTEM = "You are an agent with a long system prompt. " * 8
TASK = "Compute the sum of the numbers in data.txt with the python tool."


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerBase:
    return build_tokenizer()


def request(messages: Sequence[ChatMessage]) -> ModelRequest:
    return ModelRequest(api="chat.completions", model="m", messages=tuple(messages),
                        max_tokens=None, temperature=None)


def session_of(policy: ScriptedPolicy) -> AgentSession:
    return Gateway().open_session(SessionSettings(
        policy=policy, temperature=1.0, seed=7, max_tokens_per_turn=64,
        max_total_tokens=100_000))


def agent(session: AgentSession, calls: int, *, compact_at: int | None = None,
          sub_agent_at: int | None = None) -> None:
    """An agent that keeps its history (tool results as user messages); at ``compact_at`` it
    replaces the history with a summary; at ``sub_agent_at`` a sub-agent makes a call."""
    opening = [ChatMessage("system", SYSTEM), ChatMessage("user", TASK)]
    messages = list(opening)
    for k in range(calls):
        if k == compact_at:
            messages = [*opening, ChatMessage("user", "Summary so far: two tools ran.")]
        if k == sub_agent_at:
            session.complete(request([ChatMessage("system", "You check answers."),
                                      ChatMessage("user", "Is 3 right?")]),
                             {"x-triloop-agent": "checker"})
        answer = session.complete(request(messages), {})
        messages += [ChatMessage("assistant", answer.text),
                     ChatMessage("tool", f"result {k}: {k * 17}")]


def test_the_session_holds_its_main_loop_tokens_once_however_many_calls(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    policy = ScriptedPolicy(tokenizer, [f"python: print({k})" for k in range(20)])
    session = session_of(policy)
    agent(session, 20)
    sequence = session.trajectory.sequence
    main = session.main_calls()
    assert len(main) == 20 and sequence.segment_starts == [0]
    for call, fed in zip(main, policy.prompts, strict=True):
        # Each prompt is exactly what the model was fed, read in place from the sequence.
        assert isinstance(call.prompt_token_ids, TokenSpan)
        assert call.prompt_token_ids.base is sequence.token_ids
        assert call.prompt_token_ids == fed
    # The opening context once, then only what each call added: the sequence is the last
    # prompt plus its answer, far fewer ids than one full prompt per call.
    assert sequence.token_ids == [*policy.prompts[-1], *main[-1].completion_token_ids]
    per_call = sum(len(p) for p in policy.prompts)
    assert len(sequence.token_ids) * 5 < per_call
    sampled = [t for c in main for t in c.completion_token_ids]
    assert [t for t, m in zip(sequence.token_ids, sequence.action_mask, strict=True) if m] \
        == sampled
    assert sequence.behaviour_logprobs == [-0.25] * len(sampled)


def test_a_new_segment_starts_only_where_the_agent_rewrote_its_history(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    session = session_of(ScriptedPolicy(tokenizer, [f"python: print({k})" for k in range(9)]))
    agent(session, 8, compact_at=5, sub_agent_at=3)
    trajectory = session.trajectory
    assert session.kinds() == {"main": 8, "sub_agent": 1}  # the sub-agent is not spliced on
    assert [p.segment for p in trajectory.placements] == [0] * 5 + [1] * 3
    [cut] = trajectory.breaks
    assert cut.call == 5 and "compressed or rewrote" in cut.reason
    assert cut.segment_tokens == trajectory.sequence.segment_starts[1]
    # The calls after the rewrite extend the new segment: only their new tokens are added.
    assert [p.observation_tokens > 0 for p in trajectory.placements] == [
        False, True, True, True, True, False, True, True]
    summary = gateway_summary(session)
    assert (summary["segments"], len(summary["breaks"])) == (2, 1)
    assert summary["main_sampled_tokens"] == trajectory.sampled_tokens == sum(
        len(c.completion_token_ids) for c in session.main_calls())


def test_the_store_packs_the_session_steps_into_the_session_s_own_sequence(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    session = session_of(ScriptedPolicy(tokenizer, [f"python: print({k})" for k in range(9)]))
    agent(session, 8, compact_at=4)
    steps = episode_steps(session, [])
    assert all(isinstance(s.prompt_token_ids, TokenSpan) for s in steps)  # no copies
    assert all(isinstance(s.action_mask, ActionMask) for s in steps)  # two lengths each
    rows = [StepRow(s.index, s.prompt_token_ids, s.action_token_ids, s.action_mask,
                    s.behaviour_logprobs, s.observation, s.action_text, s.feedback, s.reward,
                    s.done) for s in steps]
    sequence, offsets = pack_steps(rows)
    assert sequence == session.trajectory.sequence
    assert offsets == session.trajectory.offsets
    assert [s.feedback["segment"] for s in steps] == [0] * 4 + [1] * 4
    assert "trajectory_break" in steps[4].feedback


class BadLogprobs(ScriptedPolicy):
    """Answers with one logprob too few."""

    def generate(self, prompt_token_ids: list[int], **kwargs: object) -> Generation:
        done = super().generate(prompt_token_ids, **kwargs)  # type: ignore[arg-type]
        return Generation(done.token_ids, done.logprobs[1:], done.text, done.finish_reason)


def test_an_answer_whose_logprobs_do_not_fit_is_refused_and_nothing_is_spliced(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    session = session_of(BadLogprobs(tokenizer, ["python: print(1)"]))
    with pytest.raises(GatewayError, match="logprobs for .* sampled tokens") as refused:
        session.complete(request([ChatMessage("user", TASK)]), {})
    assert refused.value.status == 502 and refused.value.code == "backend_error"
    assert isinstance(session.infrastructure_error, InferenceError)  # the episode retries
    assert session.calls == [] and session.trajectory.sequence.token_ids == []
    assert session.generated_tokens == 0


def random_turns(rng: random.Random, count: int) -> list[TurnTokens]:
    """Turns that mostly extend each other and sometimes rewrite or drop the history."""
    context = [rng.randrange(100) for _ in range(rng.randint(1, 6))]
    turns = []
    for _ in range(count):
        action = [rng.randrange(100) for _ in range(rng.randint(0, 3))]
        turns.append(TurnTokens(list(context), action, [-0.1] * len(action)))
        choice = rng.random()
        if choice < 0.15:
            context = context[: rng.randint(0, len(context))]  # dropped turns (maybe all)
        elif choice < 0.3:
            context = [*context[: rng.randint(0, len(context))], rng.randrange(100)]
        else:
            context = [*context, *action, *(rng.randrange(100) for _ in range(rng.randint(0, 3)))]
    return turns


def test_splicing_call_by_call_gives_the_layout_of_the_finished_list() -> None:
    rng = random.Random(3)
    for _ in range(200):
        turns = random_turns(rng, rng.randint(1, 12))
        packer = SequencePacker()
        offsets = [packer.add(t) for t in turns]
        assert (packer.sequence, offsets) == pack_turns(turns)
        trajectory = SessionTrajectory()
        for turn in turns:
            trajectory.add(MainCall(turn.prompt_token_ids, turn.action_token_ids,
                                    turn.behaviour_logprobs))
        assert trajectory.rebuilt() == rebuild_trajectory([
            MainCall(t.prompt_token_ids, t.action_token_ids, t.behaviour_logprobs)
            for t in turns])
        assert trajectory.offsets == offsets
        for k, turn in enumerate(turns):  # each call's prompt and action, read in place
            assert trajectory.prompt(k) == turn.prompt_token_ids
            assert trajectory.action(k) == turn.action_token_ids


def test_a_token_span_reads_its_slice_in_place() -> None:
    ids = [5, 6, 7, 8, 9]
    span = TokenSpan(ids, 1, 4)
    assert span == [6, 7, 8] and span == (6, 7, 8) and [6, 7, 8] == span
    assert span != [6, 7] and span != [6, 7, 9] and span != "678"
    assert len(span) == 3 and span[0] == 6 and span[-1] == 8 and span[1:] == [7, 8]
    assert span[::-1] == [8, 7, 6] and span[::2] == [6, 8]
    assert span[5:] == [] and span[-2:] == [7, 8]
    assert list(span) == [6, 7, 8] and span + [1] == [6, 7, 8, 1] and [1] + span == [1, 6, 7, 8]
    ids.append(10)  # the sequence grows; the span still means what it meant
    assert span == [6, 7, 8] and span.base is ids
    with pytest.raises(IndexError):
        span[3]
    with pytest.raises(TypeError):
        hash(span)
    with pytest.raises(ValueError, match=r"span \[2, 9\) is outside the 6 ids"):
        TokenSpan(ids, 2, 9)


def test_a_turn_s_mask_is_held_as_its_two_lengths() -> None:
    mask = step_action_mask(3, 2)
    assert isinstance(mask, ActionMask) and mask == [0, 0, 0, 1, 1] and [0, 0, 0, 1, 1] == mask
    assert list(mask) == [0, 0, 0, 1, 1] and len(mask) == 5 and sum(mask) == 2
    assert mask[2] == 0 and mask[3] == 1 and mask[-1] == 1 and mask[2:4] == [0, 1]
    assert mask != [0, 0, 1, 1, 1] and mask != ActionMask(2, 3) and mask == ActionMask(3, 2)
    assert marks_only_the_action(mask, 3, 2) and not marks_only_the_action(mask, 2, 3)
    assert marks_only_the_action([0, 0, 1], 2, 1)
    assert not marks_only_the_action([0, 1, 1], 2, 1)
    assert not marks_only_the_action([0, 0, 1, 1], 2, 1)
    with pytest.raises(IndexError):
        mask[5]
    with pytest.raises(ValueError, match="lengths must be >= 0"):
        ActionMask(-1, 2)
