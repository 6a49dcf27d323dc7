"""The batching engine: concurrent requests share micro-batches and get what they would alone."""

from __future__ import annotations

import inspect
import math
import os
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import torch

from execution_loop.inference.base import FINISH_LENGTH, FINISH_STOP, InferenceError
from execution_loop.inference.batched_sampling import Sample, SampleRequest
from execution_loop.inference.batching import BatchingEngine
from execution_loop.inference.torch_backend import TorchPolicyClient
from execution_loop.serving import backend_factory
from learning_loop.tiny_model import TinyModelSpec, create_tiny_model
from triloop.config import Settings

torch.set_num_threads(1)

# Batched and unbatched forwards add the same float32 terms in a different order (other
# matmul shapes, masked padding). Each reordered sum moves by a few ulps of its magnitude
# (float32 eps = 2**-23); through two layers and a log-softmax that stays far below 2**-13,
# about 1e-4, while two different tokens' logprobs differ by much more than that.
TOLERANCE = 2.0**-13


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = TinyModelSpec(max_position_embeddings=256)
    return create_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0, spec=spec)


@pytest.fixture(scope="module")
def client(model_dir: Path) -> TorchPolicyClient:
    # A batch closes when it is full, so a long gather wait makes every wave of eight
    # concurrent requests one micro-batch without depending on the clock.
    return TorchPolicyClient(model_dir, device="cpu", gather_wait_s=30.0, max_batch_size=8)


@pytest.fixture(scope="module")
def alone(model_dir: Path) -> TorchPolicyClient:
    """The unbatched reference: every request is decoded by itself."""
    return TorchPolicyClient(model_dir, device="cpu", max_batch_size=1)


def _prompts(client: TorchPolicyClient, count: int = 8) -> list[list[int]]:
    """Prompts of different lengths, so the batch is padded."""
    tokenizer = client.tokenizer()
    return [list(tokenizer.encode(f"Map: S F F G {'x ' * (3 * k)}reply L R U D",
                                  add_special_tokens=False)) for k in range(count)]


def _concurrently(count: int, sample: Callable[[int], Sample]) -> list[Sample]:
    """Run ``sample(i)`` for every i in its own thread, as episode activities do."""
    results: list[Sample | None] = [None] * count
    barrier = threading.Barrier(count)

    def run(i: int) -> None:
        barrier.wait()
        results[i] = sample(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(r is not None for r in results)
    return [r for r in results if r is not None]


@torch.inference_mode()
def _single_sequence_loop(
    client: TorchPolicyClient, prompt: list[int], max_new_tokens: int, temperature: float,
    seed: int,
) -> tuple[list[int], list[float]]:
    """The sampler as it was before the engine: one sequence, torch.multinomial per token."""
    model = client.model
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    generator = torch.Generator().manual_seed(seed)
    out = model(input_ids=torch.tensor([prompt]), use_cache=True)
    ids: list[int] = []
    logprobs: list[float] = []
    for _ in range(max_new_tokens):
        logits = out.logits[0, -1].float()
        logp = torch.log_softmax(logits if temperature == 0 else logits / temperature, dim=-1)
        token = (int(torch.argmax(logp)) if temperature == 0
                 else int(torch.multinomial(logp.exp(), 1, generator=generator)))
        ids.append(token)
        logprobs.append(float(logp[token]))
        if token in client.eos_token_ids:
            break
        out = model(input_ids=torch.tensor([[token]]), use_cache=True,
                    **{name: getattr(out, name)})
    return ids, logprobs


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_micro_batch_matches_the_single_sequence_sampler_it_replaced(
    client: TorchPolicyClient, temperature: float
) -> None:
    prompts = _prompts(client)
    batched = _concurrently(len(prompts), lambda i: client.sample(
        prompts[i], max_new_tokens=10, temperature=temperature, seed=100 + i))
    for i, ours in enumerate(batched):
        ids, logprobs = _single_sequence_loop(client, prompts[i], 10, temperature, 100 + i)
        assert ours.token_ids == ids
        assert ours.logprobs == pytest.approx(logprobs, abs=TOLERANCE)


def _assert_same(batched: Sample, alone: Sample) -> None:
    assert batched.token_ids == alone.token_ids
    assert batched.finish_reason == alone.finish_reason
    assert batched.stop_reason == alone.stop_reason
    assert len(batched.logprobs) == len(alone.logprobs)
    for ours, reference in zip(batched.logprobs, alone.logprobs, strict=True):
        assert abs(ours - reference) <= TOLERANCE


@pytest.mark.parametrize("temperature", [0.0, 1.0, 0.7])
def test_a_micro_batch_gives_each_request_what_it_gets_alone(
    client: TorchPolicyClient, alone: TorchPolicyClient, temperature: float
) -> None:
    prompts = _prompts(client)
    before = client.engine_stats()
    references = [alone.sample(p, max_new_tokens=12, temperature=temperature, seed=i)
             for i, p in enumerate(prompts)]
    batched = _concurrently(len(prompts), lambda i: client.sample(
        prompts[i], max_new_tokens=12, temperature=temperature, seed=i))
    after = client.engine_stats()
    # The eight concurrent requests were decoded as one micro-batch.
    assert after.largest_batch == len(prompts)
    assert after.batches - before.batches == 1
    assert alone.engine_stats().largest_batch == 1
    for ours, reference in zip(batched, references, strict=True):
        _assert_same(ours, reference)


def test_rows_that_stop_early_leave_the_others_unchanged(
    client: TorchPolicyClient, alone: TorchPolicyClient
) -> None:
    prompts = _prompts(client)
    references = [alone.sample(p, max_new_tokens=10, temperature=1.0, seed=i)
             for i, p in enumerate(prompts)]
    # Even rows stop at their fourth token (its id is their stop id); odd rows run on.
    stops = [[references[i].token_ids[3]] if i % 2 == 0 else [] for i in range(len(prompts))]
    batched = _concurrently(len(prompts), lambda i: client.sample(
        prompts[i], max_new_tokens=10, temperature=1.0, seed=i, stop_token_ids=stops[i]))
    for i, (ours, reference) in enumerate(zip(batched, references, strict=True)):
        if i % 2:
            _assert_same(ours, reference)
            continue
        end = reference.token_ids.index(stops[i][0]) + 1
        assert ours.token_ids == reference.token_ids[:end]
        assert (ours.finish_reason, ours.stop_reason) == (FINISH_STOP, stops[i][0])
        assert ours.logprobs == pytest.approx(reference.logprobs[:end], abs=TOLERANCE)


def test_batched_sampling_draws_from_the_models_distribution(client: TorchPolicyClient) -> None:
    """Chi-square goodness of fit of 400 batched first tokens against softmax(logits / T)."""
    prompt = _prompts(client, 1)[0]
    temperature, draws = 1.0, 400
    with torch.inference_mode():
        logits = client.model(input_ids=torch.tensor([prompt])).logits[0, -1].float()
    expected = torch.softmax(logits / temperature, dim=-1).tolist()
    counts: Counter[int] = Counter()
    for wave in range(draws // 8):
        samples = _concurrently(8, lambda i, wave=wave: client.sample(
            prompt, max_new_tokens=1, temperature=temperature, seed=1000 + 8 * wave + i))
        counts.update(s.token_ids[0] for s in samples)
    # Ten cells of about equal expected mass: tokens sorted by probability, cut by
    # cumulative mass (the vocabulary is too flat for one cell per token).
    order = sorted(range(len(expected)), key=lambda t: -expected[t])
    cell_of, mass = {}, 0.0
    for token in order:
        cell_of[token] = min(int(mass * 10), 9)
        mass += expected[token]
    observed = Counter(dict.fromkeys(range(10), 0))
    want = Counter(dict.fromkeys(range(10), 0.0))
    for token, count in counts.items():
        observed[cell_of[token]] += count
    for token, p in enumerate(expected):
        want[cell_of[token]] += draws * p
    assert min(want.values()) >= 5, "a cell too small for the chi-square approximation"
    statistic = sum((observed[c] - want[c]) ** 2 / want[c] for c in range(10))
    dof = 9
    # Wilson-Hilferty: the chi-square quantile at p = 0.001 (z = 3.09).
    critical = dof * (1 - 2 / (9 * dof) + 3.09 * math.sqrt(2 / (9 * dof))) ** 3
    assert statistic < critical, f"chi-square {statistic:.1f} over {dof} dof >= {critical:.1f}"


def test_a_closed_engine_still_serves_an_episode_that_holds_it(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    model_dir = create_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=1)
    client = TorchPolicyClient(model_dir, device="cpu", max_batch_size=1)
    prompt = _prompts(client, 1)[0]
    before = client.sample(prompt, max_new_tokens=6, temperature=1.0, seed=3)
    client.close()
    after = client.sample(prompt, max_new_tokens=6, temperature=1.0, seed=3)
    _assert_same(after, before)
    assert after.finish_reason in (FINISH_STOP, FINISH_LENGTH)


def test_a_failed_batch_fails_every_request_in_it_as_an_inference_error() -> None:
    def broken(requests: Sequence[SampleRequest]) -> None:
        raise RuntimeError(f"CUDA out of memory with {len(requests)} rows")

    engine = BatchingEngine(broken, name="ckpt", gather_wait_s=30.0, max_batch_size=3)

    def request(_: int) -> Sample:
        return engine.sample(SampleRequest([1, 2], 4, 1.0, torch.Generator(), frozenset(),
                                           frozenset()))

    errors: list[BaseException] = []

    def run(i: int) -> Sample:
        try:
            return request(i)
        except InferenceError as error:
            errors.append(error)
            return Sample([], [], FINISH_LENGTH, None, [])

    _concurrently(3, run)
    engine.close()
    assert len(errors) == 3
    assert all("out of memory with 3 rows" in str(e) for e in errors)


def test_engine_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="max_batch_size"):
        BatchingEngine(lambda _: None, name="x", max_batch_size=0)
    with pytest.raises(ValueError, match="gather_wait_s"):
        BatchingEngine(lambda _: None, name="x", gather_wait_s=-1)


def test_the_engine_decodes_with_its_own_torch_thread_limit() -> None:
    """torch's intra-op pool is per calling thread: the limit holds in the engine's thread."""
    want = (os.cpu_count() or 1) + 1  # neither torch's default nor this module's 1
    seen: list[int] = []

    def record(requests: Sequence[SampleRequest]) -> None:
        seen.append(torch.get_num_threads())

    engine = BatchingEngine(record, name="ckpt", torch_threads=want)
    try:
        engine.sample(SampleRequest([1, 2], 4, 1.0, torch.Generator(), frozenset(), frozenset()))
    finally:
        engine.close()
    assert seen == [want]
    with pytest.raises(ValueError, match="torch_threads"):
        BatchingEngine(record, name="x", torch_threads=0)


def test_settings_reach_the_in_process_engine(model_dir: Path) -> None:
    """TRILOOP_BATCH_GATHER_MS and TRILOOP_TORCH_THREADS configure each checkpoint's engine."""
    settings = Settings(batch_gather_ms=40.0, torch_threads=3)
    client = backend_factory(settings)("ckpt", model_dir)
    assert isinstance(client, TorchPolicyClient)
    try:
        assert client.engine.gather_wait_s == pytest.approx(0.040)
        assert client.engine.torch_threads == 3
    finally:
        client.engine.close()
    assert Settings().batch_gather_ms == 15.0 and Settings().torch_threads is None


class Watcher:
    """A turn's watcher: what the engine told it, in order."""

    def __init__(self, owner: str, stop: threading.Event | None = None) -> None:
        self.owner = owner
        self.tokens: list[int] = []
        self.waits: list[bool] = []
        self._stop = stop

    def decoded(self, tokens: int) -> None:
        self.tokens.append(tokens)

    def waiting(self, engine_advanced: bool) -> None:
        self.waits.append(engine_advanced)
        if self._stop is not None and self._stop.is_set():
            raise RuntimeError("episode cancelled")


def _request() -> SampleRequest:
    return SampleRequest([1, 2], 3, 1.0, torch.Generator(), frozenset(), frozenset())


def test_every_token_is_reported_and_a_queued_request_hears_the_engine_advance() -> None:
    """A turn hears each of its tokens; a turn queued behind a long micro-batch hears that
    the engine is advancing others (it waits its turn, it is not stuck)."""
    first_in, go, more = threading.Event(), threading.Event(), threading.Event()
    decoded_batches: list[int] = []

    def slow_sampler(requests: Sequence[SampleRequest]) -> None:
        decoded_batches.append(len(requests))
        if len(decoded_batches) == 1:
            requests[0].take(7, -0.5, None)  # one token, then hold the batch open
            first_in.set()
            assert go.wait(30)
            requests[0].take(8, -0.5, None)
            assert more.wait(30)
        for request in requests:
            while not request.take(9, -0.5, None):
                pass

    engine = BatchingEngine(slow_sampler, name="ckpt", gather_wait_s=0.0)
    busy, queued = Watcher("run-a"), Watcher("run-b")

    def ask(watcher: Watcher) -> Sample:
        from execution_loop.inference.progress import watching_decode

        with watching_decode(watcher):
            return engine.sample(_request())

    results: list[Sample] = []
    first = threading.Thread(target=lambda: results.append(ask(busy)))
    first.start()
    assert first_in.wait(30)
    second = threading.Thread(target=lambda: results.append(ask(queued)))
    second.start()
    while not queued.waits:  # queued behind the open batch, told the engine is idle
        second.join(0.05)
    go.set()  # the first batch decodes another token: the queued turn hears it
    while True not in queued.waits:
        second.join(0.05)
    more.set()
    first.join(30)
    second.join(30)
    engine.close()
    assert busy.tokens == [1, 2, 3] and queued.tokens == [1, 2, 3]
    assert queued.waits[0] is False and True in queued.waits
    assert decoded_batches == [1, 1] and len(results) == 2


def test_a_cancelled_turn_leaves_the_queue_without_being_decoded() -> None:
    first_in, release = threading.Event(), threading.Event()
    served: list[int] = []

    def sampler(requests: Sequence[SampleRequest]) -> None:
        served.append(len(requests))
        first_in.set()
        assert release.wait(30)
        for request in requests:
            while not request.take(9, -0.5, None):
                pass

    from execution_loop.inference.progress import watching_decode

    engine = BatchingEngine(sampler, name="ckpt", gather_wait_s=0.0)
    blocker = threading.Thread(target=lambda: engine.sample(_request()))
    blocker.start()
    assert first_in.wait(30)
    stop = threading.Event()
    stop.set()  # the episode's activity is already cancelled
    with watching_decode(Watcher("run-b", stop)), pytest.raises(RuntimeError, match="cancelled"):
        engine.sample(_request())
    release.set()
    blocker.join(30)
    engine.close()
    assert served == [1]  # the cancelled turn was never decoded
