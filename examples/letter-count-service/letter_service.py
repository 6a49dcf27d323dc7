"""The reference environment service: ``letter_count`` served over triloop's HTTP protocol.

It proves the protocol (``docs/environment-service.md``): any program that answers these
routes the same way, in any language, can be trained on. It keeps its episodes in memory
and verifies them itself; its verifier digest is the sha256 of this file, which the
contract pins. Run it with ``python letter_service.py --port 8400``.

Its only triloop import is the protocol's standalone models, ``triloop_environment_protocol``
(one file, standard library and pydantic): copy that file beside a service of your own.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import re
import string
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, HTTPException, Response

from triloop_environment_protocol import (
    Observation,
    ReferenceReply,
    ResetRequest,
    ServiceCapabilities,
    ServiceInfo,
    StepReply,
    StepRequest,
    Verdict,
)

VERIFIER_DIGEST = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
_NUMBER = re.compile(r"-?\d+")  # the first integer in a reply is the answer
app = FastAPI(title="letter_count environment service", version="1")


@dataclass
class Episode:
    """One episode's state, kept only here: the agent never sees the expected count."""

    seed: int
    word: str
    letter: str
    count: int
    max_turns: int
    turn: int = 0
    answer: int | None = None
    done: bool = False

    def fingerprint(self) -> str:
        state = f"{self.seed}/{self.word}/{self.letter}/{self.turn}/{self.done}"
        return hashlib.sha256(state.encode()).hexdigest()


EPISODES: dict[str, Episode] = {}


def puzzle(seed: int, length: int) -> tuple[str, str, int]:
    """The seed's word, letter and how often the letter occurs."""
    rng = random.Random(f"letter_count/{length}/{seed}")
    letters = rng.sample("aeiost", 3)
    word = "".join(rng.choice(letters + list(string.ascii_lowercase[:4])) for _ in range(length))
    letter = rng.choice(letters)
    return word, letter, word.count(letter)


def _start(request: ResetRequest) -> Episode:
    word, letter, count = puzzle(request.seed, int(request.initial_state.get("word_length", 8)))
    return Episode(request.seed, word, letter, count, request.max_turns)


def _observation(episode_id: str, episode: Episode) -> Observation:
    text = f"How many times does '{episode.letter}' occur in '{episode.word}'? Reply with a number."
    return Observation(episode_id=episode_id, observation=text,
                       fingerprint=episode.fingerprint())


def _episode(episode_id: str) -> Episode:
    episode = EPISODES.get(episode_id)
    if episode is None:
        raise HTTPException(404, f"no episode {episode_id}")
    return episode


@app.get("/info")
def info() -> ServiceInfo:
    return ServiceInfo(
        task="letter_count_service",
        capabilities=ServiceCapabilities(
            actions=["answer"], observations=["question"], success_criteria=["exact_answer"],
            outcome_terms=["success", "failure"], process_terms=["valid_action"],
            initial_state=["word_length"],
        ),
        verifier_digest=VERIFIER_DIGEST,
    )


@app.post("/episodes")
def create(request: ResetRequest) -> Observation:
    episode_id = uuid.uuid4().hex
    EPISODES[episode_id] = _start(request)
    return _observation(episode_id, EPISODES[episode_id])


@app.post("/episodes/{episode_id}/reset")
def reset(episode_id: str, request: ResetRequest) -> Observation:
    _episode(episode_id)
    EPISODES[episode_id] = _start(request)
    return _observation(episode_id, EPISODES[episode_id])


@app.post("/episodes/{episode_id}/step")
def step(episode_id: str, request: StepRequest) -> StepReply:
    episode = _episode(episode_id)
    if episode.done:
        raise HTTPException(409, "the episode is over; reset it")
    episode.turn += 1
    match = _NUMBER.search(request.action)
    terms: list[str] = []
    feedback: dict[str, Any] = {"valid_action": match is not None}
    if match:
        episode.answer, episode.done = int(match.group(0)), True
        terms.append("valid_action")
        text = "answer recorded"
    else:
        episode.done = episode.turn >= episode.max_turns
        feedback["truncated"] = "max_turns" if episode.done else None
        text = "Reply with a number."
    return StepReply(observation=text, done=episode.done, terms=terms, feedback=feedback,
                     fingerprint=episode.fingerprint())


@app.post("/episodes/{episode_id}/verify")
def verify(episode_id: str) -> Verdict:
    episode = _episode(episode_id)
    success = episode.answer == episode.count
    return Verdict(success=success, verifier_digest=VERIFIER_DIGEST,
                   details={"expected": episode.count, "given": episode.answer})


@app.delete("/episodes/{episode_id}", status_code=204)
def close(episode_id: str) -> Response:
    EPISODES.pop(episode_id, None)
    return Response(status_code=204)


@app.post("/reference")
def reference(request: ResetRequest) -> ReferenceReply:
    return ReferenceReply(actions=[str(_start(request).count)])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8400)
    args = parser.parse_args()
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
