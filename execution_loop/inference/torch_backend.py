"""In-process sampling with torch/transformers from a local Hugging Face checkpoint directory.

The sampling loop is written out (no ``model.generate``) so that what is returned is exactly
what was sampled: token ``t`` is drawn from ``softmax(logits / temperature)`` with a
generator seeded per request, and its logprob is read from that same distribution. A
teacher-forced forward pass over prompt + sampled ids reproduces those logprobs (to float
rounding), which is what makes the learner's importance ratios start at 1.0.
Temperature 0 is greedy and, as in vLLM, reports logprobs of the untempered distribution.

Each client owns one ``BatchingEngine``: concurrent episodes' requests are decoded together
in padded micro-batches (``batched_sampling``), each row as it would be decoded alone.

A LoRA adapter checkpoint (``triloop.weights.is_adapter_dir``) is served as its base plus
the adapter, unmerged, as the learner computes it: the base's tensors are read once per
process and shared (not copied) by every adapter on that base that is loaded at the same
time (``SharedBase``); each adapter gets its own module tree around them, so engines of
different adapters never switch one model's adapter under each other.
"""

from __future__ import annotations

import inspect
import threading
import weakref
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    PreTrainedTokenizerBase,
)

from execution_loop.inference.base import (
    Generation,
    PromptTooLongError,
    decode_action,
    validate_request,
)
from execution_loop.inference.batched_sampling import (
    Sample,
    SampleRequest,
    next_token_logprobs,
    sample_batch,
)
from execution_loop.inference.batching import BatchingEngine, EngineStats
from triloop.weights import is_adapter_dir

__all__ = ["Sample", "TorchPolicyClient", "teacher_forced_logprobs"]


def _eos_token_ids(model: Any) -> frozenset[int]:
    ids: set[int] = set()
    for source in (model.generation_config, model.config):
        eos = getattr(source, "eos_token_id", None)
        if isinstance(eos, int):
            ids.add(eos)
        elif isinstance(eos, list | tuple):
            ids.update(int(i) for i in eos)
    return frozenset(ids)


def _pad_token_id(model: Any, eos_token_ids: frozenset[int]) -> int:
    """Any valid id does: padded positions are masked out of attention."""
    pad = getattr(model.config, "pad_token_id", None)
    if isinstance(pad, int):
        return pad
    return min(eos_token_ids) if eos_token_ids else 0


# from_pretrained builds the model on the meta device through process-global state: two
# threads loading at once can get each other's meta tensors ("Cannot copy out of meta
# tensor"). The worker's cache loads different checkpoints concurrently, so loads in this
# process take turns here.
_LOADING = threading.Lock()


class SharedBase:
    """A base model's tensors, read once, shared by the adapters served on it."""

    def __init__(self, base_dir: Path, dtype: torch.dtype, device: torch.device) -> None:
        self.base_dir = base_dir
        self.config = AutoConfig.from_pretrained(base_dir)
        generation = base_dir / "generation_config.json"
        self.generation_config = (GenerationConfig.from_pretrained(base_dir)
                                  if generation.is_file() else None)
        tensors: dict[str, torch.Tensor] = {}
        for file in sorted(base_dir.glob("*.safetensors")):
            tensors.update(load_file(str(file)))
        if not tensors:
            raise FileNotFoundError(f"base {base_dir} has no *.safetensors weights")
        self.tensors = {name: t.to(device=device, dtype=dtype) for name, t in tensors.items()}
        self.dtype = dtype

    def model(self) -> Any:
        """A new module tree whose parameters are this base's tensors (no copy)."""
        with torch.random.fork_rng(devices=[]):  # the throw-away init must not move the RNG
            model: Any = AutoModelForCausalLM.from_config(self.config, dtype=self.dtype)
        missing, unexpected = model.load_state_dict(self.tensors, strict=False, assign=True)
        output, shared = model.get_output_embeddings(), model.get_input_embeddings()
        if getattr(self.config, "tie_word_embeddings", False) and output is not None:
            output.weight = shared.weight  # assign=True replaced the tied parameter
            missing = [m for m in missing if m != "lm_head.weight"]
        if unexpected or missing:
            raise ValueError(f"base {self.base_dir} does not fit its config: missing"
                             f" {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}")
        if self.generation_config is not None:
            model.generation_config = self.generation_config
        return model


# Bases in memory, by directory, dtype and device, while an adapter client holds them.
_BASES: weakref.WeakValueDictionary[tuple[str, str, str], SharedBase] = (
    weakref.WeakValueDictionary())


def shared_base(base_dir: Path, dtype: torch.dtype, device: torch.device) -> SharedBase:
    """The base at ``base_dir``, read from disk only if no client holds it already."""
    key = (str(base_dir.resolve()), str(dtype), str(device))
    base = _BASES.get(key)
    if base is None:
        base = SharedBase(base_dir, dtype, device)
        _BASES[key] = base
    return base


def _adapter_model(adapter_dir: Path, base: SharedBase) -> Any:
    """Base plus the adapter in ``adapter_dir``, unmerged, in eval mode."""
    from peft import PeftModel

    return PeftModel.from_pretrained(base.model(), str(adapter_dir), is_trainable=False)


class TorchPolicyClient:
    """A ``PolicyClient`` that runs the checkpoint in this process (CPU or CUDA)."""

    def __init__(
        self,
        model_dir: Path | str,
        *,
        device: str | torch.device | None = None,
        checkpoint_id: str | None = None,
        dtype: torch.dtype = torch.float32,
        max_batch_size: int = 64,
        gather_wait_s: float = 0.015,
        torch_threads: int | None = None,
        base_dir: Path | None = None,
    ) -> None:
        self.model_dir = Path(model_dir)
        if not (self.model_dir / "config.json").is_file():
            raise FileNotFoundError(
                f"{self.model_dir} is not a Hugging Face checkpoint directory (no config.json); "
                "create one with `triloop model init-tiny DIR`"
            )
        self.device = torch.device(
            device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu")
        )
        self.checkpoint_id = checkpoint_id or self.model_dir.name
        # An adapter holds its base (shared with other adapters on it) while it is served.
        self.base: SharedBase | None = None
        with _LOADING:
            if is_adapter_dir(self.model_dir):
                if base_dir is None:
                    raise ValueError(f"{self.model_dir} is a LoRA adapter: serving it needs the"
                                     " directory of its base checkpoint (base_dir)")
                self.base = shared_base(Path(base_dir), dtype, self.device)
                model: Any = _adapter_model(self.model_dir, self.base)
            else:
                model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=dtype)
            self.model: Any = model.to(self.device).eval()
        self.max_model_len = int(self.model.config.max_position_embeddings)
        self.eos_token_ids = _eos_token_ids(self.model)
        # transformers 5 renamed the KV-cache argument and output field (past_key_values -> cache).
        inner = self.model.get_base_model() if self.base is not None else self.model
        forward_parameters = inspect.signature(inner.forward).parameters
        cache_name = "cache" if "cache" in forward_parameters else "past_key_values"
        self._tokenizer: PreTrainedTokenizerBase | None = None
        # One engine per loaded checkpoint: its thread is the only one running the model.
        self.engine = BatchingEngine(
            partial(sample_batch, self.model, cache_name=cache_name,
                    pad_token_id=_pad_token_id(self.model, self.eos_token_ids)),
            name=self.checkpoint_id, max_batch_size=max_batch_size, gather_wait_s=gather_wait_s,
            torch_threads=torch_threads,
        )

    def tokenizer(self) -> PreTrainedTokenizerBase:
        """The checkpoint's tokenizer, loaded once."""
        if self._tokenizer is None:
            self._tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        return self._tokenizer

    def generate(
        self,
        prompt_token_ids: list[int],
        *,
        max_new_tokens: int,
        temperature: float,
        seed: int | None,
        stop_token_ids: Sequence[int] = (),
    ) -> Generation:
        """Sample a continuation; returns the exact ids and their behaviour logprobs."""
        sample = self.sample(
            prompt_token_ids,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            seed=seed,
            stop_token_ids=stop_token_ids,
        )
        text = decode_action(self.tokenizer(), sample.token_ids)
        return Generation(
            token_ids=sample.token_ids,
            logprobs=sample.logprobs,
            text=text,
            finish_reason=sample.finish_reason,
        )

    def sample(
        self,
        prompt_token_ids: Sequence[int],
        *,
        max_new_tokens: int,
        temperature: float,
        seed: int | None,
        stop_token_ids: Sequence[int] = (),
        ignore_eos: bool = False,
        top_logprobs: int = 0,
    ) -> Sample:
        """Sample with a KV cache; the stopping token is included in the returned ids."""
        validate_request(prompt_token_ids, max_new_tokens, temperature)
        if len(prompt_token_ids) + max_new_tokens > self.max_model_len:
            raise PromptTooLongError.for_lengths(
                len(prompt_token_ids), max_new_tokens, self.max_model_len
            )
        vocab_size = int(self.model.config.vocab_size)
        bad = [t for t in prompt_token_ids if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(
                f"prompt token ids out of the vocabulary (size {vocab_size}): {bad[:5]}"
            )
        generator = torch.Generator(device=self.device)
        if seed is None:
            generator.seed()
        else:
            generator.manual_seed(seed)
        stops = frozenset(int(t) for t in stop_token_ids)
        request = SampleRequest(
            prompt_token_ids=[int(t) for t in prompt_token_ids],
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            generator=generator,
            ends=stops if ignore_eos else stops | self.eos_token_ids,
            stops=stops,
            top_logprobs=top_logprobs,
        )
        return self.engine.sample(request)

    def engine_stats(self) -> EngineStats:
        """How many micro-batches this checkpoint's engine ran, and how large."""
        return self.engine.stats()

    def close(self) -> None:
        """Stop the engine's thread (the worker's cache evicted this checkpoint)."""
        self.engine.close()


@torch.inference_mode()
def teacher_forced_logprobs(
    model: Any,
    prompt_token_ids: Sequence[int],
    continuation_ids: Sequence[int],
    *,
    temperature: float = 1.0,
) -> list[float]:
    """Logprobs of ``continuation_ids`` after the prompt in one full forward pass."""
    device = next(model.parameters()).device
    sequence = torch.tensor([[*prompt_token_ids, *continuation_ids]], device=device)
    logits = model(input_ids=sequence).logits[0]
    start = len(prompt_token_ids) - 1
    logp = next_token_logprobs(logits[start : start + len(continuation_ids)], temperature)
    targets = torch.tensor(list(continuation_ids), device=device)
    return [float(v) for v in logp.gather(-1, targets[:, None]).squeeze(-1).tolist()]
