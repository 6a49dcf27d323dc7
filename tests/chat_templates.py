"""Qwen3's reasoning chat template on the tiny model's tokenizer, and a tiny model for it.

``tests/data/qwen3_chat_template.jinja`` is the chat template Qwen3 ships in its
``tokenizer_config.json`` (Qwen/Qwen3-8B; the Qwen3 models are Apache-2.0), copied verbatim
from published copies of that file. It renders an assistant turn that comes before the
last user message without its ``<think>`` block, the last one with a (possibly empty)
think block, and its generation prompt is ``<|im_start|>assistant\\n``, followed by an
empty think block when ``enable_thinking=False``. ``NO_THINKING_TEMPLATE`` is the same
template with thinking turned off for good, the way trainers patch it (the
``enable_thinking is false`` test replaced by ``true``): every generation prompt then holds
an empty think block that the history never shows, so no prompt extends the one before.

The tiny tokenizer gets Qwen3's markers as Qwen3's tokenizer has them: ``<|im_start|>`` and
``<|im_end|>`` special (``<|im_end|>`` ends a turn), ``<think>`` and ``</think>`` plain
added tokens (so an action's think block survives decoding without special tokens).
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerBase

from learning_loop.tiny_model import ROLE_TOKENS, build_tokenizer, create_tiny_model

QWEN3_TEMPLATE = (Path(__file__).parent / "data" / "qwen3_chat_template.jinja").read_text()
NO_THINKING_TEMPLATE = QWEN3_TEMPLATE.replace(
    "enable_thinking is defined and enable_thinking is false", "true")
IM_START, IM_END, THINK, END_THINK = "<|im_start|>", "<|im_end|>", "<think>", "</think>"


def qwen3_style_tokenizer(template: str = QWEN3_TEMPLATE) -> PreTrainedTokenizerBase:
    """The tiny tokenizer with Qwen3's markers and ``template`` as its chat template."""
    tokenizer = build_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": [*ROLE_TOKENS, IM_START, IM_END]})
    tokenizer.add_tokens([THINK, END_THINK])
    tokenizer.eos_token = IM_END
    tokenizer.chat_template = template
    return tokenizer


def create_qwen3_style_model(path: Path, *, template: str = QWEN3_TEMPLATE,
                             seed: int = 0) -> Path:
    """The tiny model in ``path`` with ``qwen3_style_tokenizer`` (embeddings grown to fit)."""
    create_tiny_model(path, seed=seed)
    tokenizer = qwen3_style_tokenizer(template)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    end = tokenizer.eos_token_id
    model.config.eos_token_id = end
    model.generation_config.eos_token_id = [end]
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
