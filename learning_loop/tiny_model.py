"""The tiny policy model: a small Llama causal LM and a tokenizer built locally.

Nothing is downloaded. The tokenizer is a BPE over the printable ASCII characters whose
only merges spell out the words our environments use, so any ASCII text round-trips and
common words cost one token; the action tokens ``L R U D`` and the digits are single
characters. Chat roles are special tokens (``<|system|>``, ``<|user|>``, ``<|assistant|>``,
``<|tool|>``) and ``<|end|>`` closes a turn, which makes it the end-of-sequence token.

Everything is written with ``save_pretrained`` in the standard layout (``config.json``,
``generation_config.json``, ``model.safetensors``, ``tokenizer.json``,
``tokenizer_config.json``) so ``AutoModelForCausalLM``/``AutoTokenizer`` and vLLM load it.
The same seed gives bit-identical files.
"""

from __future__ import annotations

import json
import math
import string
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)
from transformers.utils import logging as hf_logging

from learning_loop.checkpoints import readable_by_readers

PAD, BOS, END, UNK = "<|pad|>", "<|bos|>", "<|end|>", "<|unk|>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>", "<|tool|>")
SPECIAL_TOKENS = (PAD, BOS, END, UNK, *ROLE_TOKENS)

# Words the built-in environments and their prompts use; each becomes one token (with and
# without a leading space, lower-case and capitalised). Order does not change the result.
ENVIRONMENT_WORDS = (
    "action",
    "actions",
    "agent",
    "answer",
    "assert",
    "at",
    "box",
    "calculate",
    "ci",
    "code",
    "command",
    "correct",
    "coverage",
    "done",
    "down",
    "edit",
    "error",
    "exit",
    "fail",
    "failed",
    "failure",
    "fell",
    "file",
    "fix",
    "frozen",
    "goal",
    "grid",
    "hole",
    "ice",
    "in",
    "invalid",
    "is",
    "lake",
    "left",
    "line",
    "log",
    "map",
    "move",
    "no",
    "not",
    "of",
    "ok",
    "on",
    "pass",
    "passed",
    "player",
    "print",
    "python",
    "reached",
    "result",
    "retry",
    "return",
    "reward",
    "right",
    "run",
    "skip",
    "source",
    "step",
    "success",
    "target",
    "task",
    "test",
    "tests",
    "the",
    "to",
    "tool",
    "turn",
    "turns",
    "up",
    "wall",
    "you",
    "your",
    "yes",
    "assistant",
    "system",
    "user",
)

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant', 'tool'] %}"
    "{{ raise_exception('unknown chat role: ' + message['role']) }}"
    "{% endif %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

# Words (optionally after one space), single digits, single whitespace, single symbols.
_PRETOKENIZE_PATTERN = r" ?[A-Za-z]+| ?[0-9]|\s|[^A-Za-z0-9\s]"


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape of the tiny model; the defaults give about 150k parameters."""

    hidden_size: int = 64
    """Width of the residual stream."""
    intermediate_size: int = 256
    """Width of each MLP."""
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    """Heads of 32 dimensions: a head size every vLLM attention backend supports."""
    num_key_value_heads: int = 1
    max_position_embeddings: int = 4096
    """Longest context in tokens (RoPE, so it costs no parameters)."""
    words: tuple[str, ...] = ENVIRONMENT_WORDS
    """Words that become single tokens; empty gives a pure character vocabulary."""


@dataclass(frozen=True)
class TinyModelInfo:
    """What ``create_tiny_model`` wrote."""

    path: Path
    num_parameters: int
    vocab_size: int


def build_tokenizer(
    words: tuple[str, ...] = ENVIRONMENT_WORDS, *, model_max_length: int = 4096
) -> PreTrainedTokenizerFast:
    """Build the character-plus-words BPE tokenizer with the chat template set."""
    alphabet = [c for c in string.printable if c not in "\x0b\x0c\r"]
    backend = Tokenizer(models.BPE(unk_token=UNK))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(_PRETOKENIZE_PATTERN), behavior="isolated")
    backend.decoder = decoders.Fuse()
    trainer = trainers.BpeTrainer(
        vocab_size=1_000_000,  # never the limit: training stops when every word is one token
        min_frequency=1,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=alphabet,
        limit_alphabet=len(alphabet),
        show_progress=False,
    )
    forms = sorted({f for w in words for f in (w, w.capitalize()) for f in (f, " " + f)})
    backend.train_from_iterator(forms, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=backend,
        bos_token=BOS,
        eos_token=END,
        pad_token=PAD,
        unk_token=UNK,
        additional_special_tokens=list(ROLE_TOKENS),
        model_max_length=model_max_length,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def _portable_tokenizer_config(path: Path, tokenizer: PreTrainedTokenizerFast) -> None:
    """Rewrite tokenizer_config.json in the form transformers 4.x and 5.x both read (vLLM)."""
    config_path = path / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.pop("extra_special_tokens", None)
    config.pop("backend", None)
    config.update(
        tokenizer_class="PreTrainedTokenizerFast",
        additional_special_tokens=list(ROLE_TOKENS),
        chat_template=CHAT_TEMPLATE,
        model_max_length=tokenizer.model_max_length,
        clean_up_tokenization_spaces=False,
    )
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _portable_model_config(path: Path, rope_theta: float) -> None:
    """Add the 4.x spellings (torch_dtype, rope_theta) beside the 5.x ones for older readers."""
    config_path = path / "config.json"
    config = json.loads(config_path.read_text())
    config.setdefault("torch_dtype", config.get("dtype", "float32"))
    config.setdefault("rope_theta", rope_theta)
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def create_tiny_model(path: Path, *, seed: int = 0, spec: TinyModelSpec | None = None) -> Path:
    """Create the tiny model and tokenizer in ``path``; the same seed gives identical files."""
    spec = spec or TinyModelSpec()
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(spec.words, model_max_length=spec.max_position_embeddings)
    rope_theta = 10_000.0
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )
    # Seed the global generator for the init only; the caller's RNG state is restored after.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(  # type: ignore[no-untyped-call]
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=[tokenizer.eos_token_id],
        pad_token_id=tokenizer.pad_token_id,
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
    )
    bar_was_on = hf_logging.is_progress_bar_enabled()
    # A "writing shards" progress bar for one small file is noise.
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    try:
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
    finally:
        if bar_was_on:
            hf_logging.enable_progress_bar()  # type: ignore[no-untyped-call]
    _portable_tokenizer_config(path, tokenizer)
    _portable_model_config(path, rope_theta)
    # A base model is read by every loop's OS user (the writer made the weights 0600).
    readable_by_readers(path)
    return path


def tiny_model_info(path: Path) -> TinyModelInfo:
    """Count the parameters and read the vocabulary size of a saved checkpoint directory."""
    path = Path(path)
    num_parameters = 0
    for weights in sorted(path.glob("*.safetensors")):
        with safe_open(str(weights), framework="pt") as tensors:
            for name in tensors.keys():
                num_parameters += math.prod(tensors.get_slice(name).get_shape())
    vocab_size = int(json.loads((path / "config.json").read_text())["vocab_size"])
    return TinyModelInfo(path=path, num_parameters=num_parameters, vocab_size=vocab_size)
