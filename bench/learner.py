"""Learner benchmark: GRPO update throughput and peak memory against a plain LM update.

For one fixed batch (N samples of P prompt + A action tokens) it times
`learning_loop.update.update_policy` (masked GRPO loss over action tokens only, entropy and
ratio metrics) and, as the reference point, the plain unmasked full-sequence next-token
loss with the same model, micro-batching, clipping and optimizer. It prints seconds per
update, trainable tokens per second (action tokens for GRPO, every target token for the
reference), peak memory, and the ratios GRPO / reference.

    .venv/bin/python bench/learner.py            # CPU default: well under a minute
    .venv/bin/python bench/learner.py --samples 64 --prompt-tokens 256 --json

Peak memory is what an update needs above what was in use before it (model, optimizer
state, batch): CUDA's max allocated bytes on a GPU; on CPU the growth of the process's
peak resident set (VmHWM, reset before each variant; Linux only, else "n/a").
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, Qwen2Config

from learning_loop.batch import TrainingSample, collate
from learning_loop.update import UpdateSettings, build_optimizer, select_device, update_policy
from triloop.run_config import OptimizerConfig, UpdateConfig


@dataclass(frozen=True)
class Result:
    name: str
    seconds_per_update: float
    trainable_tokens: int
    peak_memory_mib: float | None

    @property
    def tokens_per_second(self) -> float:
        return self.trainable_tokens / self.seconds_per_update


def make_model(vocab: int, hidden: int, layers: int, device: torch.device) -> PreTrainedModel:
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 4,
        num_hidden_layers=layers, num_attention_heads=max(1, hidden // 32),
        num_key_value_heads=max(1, hidden // 64), max_position_embeddings=4096,
    )
    model: PreTrainedModel = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
    model.to(device)  # type: ignore[arg-type]  # transformers mistypes its wrapped .to
    return model


def make_samples(n: int, prompt: int, action: int, vocab: int) -> list[TrainingSample]:
    gen = torch.Generator().manual_seed(0)
    samples = []
    for i in range(n):
        # Lengths vary a little, as real rollouts do, so padding is part of the cost.
        p, a = prompt - (i % 4) * prompt // 16, action - (i % 3) * action // 8
        ids = torch.randint(0, vocab, (p + a,), generator=gen).tolist()
        samples.append(TrainingSample(
            f"t{i}", f"g{i // 8}", "bench", 0, tuple(ids[:p]), tuple(ids[p:]),
            tuple([-6.0] * a), 1.0 if i % 2 else -1.0,
        ))
    return samples


def full_sequence_update(
    model: PreTrainedModel, optimizer: torch.optim.Optimizer, samples: list[TrainingSample],
    micro_batch_size: int, max_grad_norm: float, device: torch.device,
) -> int:
    """The reference: unmasked next-token cross-entropy over every real token."""
    model.train(False)  # same dropout setting as update_policy
    targets = sum(s.length - 1 for s in samples)
    ordered = sorted(samples, key=lambda s: s.length, reverse=True)
    for start in range(0, len(ordered), micro_batch_size):
        batch = collate(ordered[start : start + micro_batch_size]).to(device)
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        labels = batch.input_ids[:, 1:].masked_fill(batch.attention_mask[:, 1:] == 0, -100)
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].float().flatten(0, 1), labels.flatten(), ignore_index=-100,
            reduction="sum",
        ) / targets
        torch.autograd.backward(loss)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return targets


def measure(name: str, step: Callable[[], int], repeats: int, device: torch.device) -> Result:
    step()  # warm-up: allocator, kernels, optimizer state
    baseline = _reset_peak(device)
    times, tokens = [], 0
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        tokens = step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    peak = _peak_mib(device)
    return Result(name, statistics.median(times), tokens,
                  None if peak is None or baseline is None else peak - baseline)


def _reset_peak(device: torch.device) -> float | None:
    """Reset the peak counter; returns the memory in use now (MiB), the baseline."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return torch.cuda.memory_allocated(device) / 2**20
    try:  # Linux: writing 5 resets the process's peak resident set size to the current one
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return None  # no resettable peak: report none rather than a misleading number
    return _proc_status_mib("VmRSS:")


def _peak_mib(device: torch.device) -> float | None:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return _proc_status_mib("VmHWM:")


def _proc_status_mib(field: str) -> float | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


VARIANTS = {"reference": "full-sequence LM loss (reference)", "grpo": "GRPO, action-masked"}


def run_variant(args: argparse.Namespace, variant: str) -> Result:
    """Time one variant in this process."""
    torch.set_num_threads(args.threads)
    device = torch.device(args.device) if args.device else select_device()
    samples = make_samples(args.samples, args.prompt_tokens, args.action_tokens, args.vocab)
    model = make_model(args.vocab, args.hidden, args.layers, device)
    settings = UpdateSettings(update=UpdateConfig(micro_batch_size=args.micro_batch))
    optimizer, _ = build_optimizer(model, OptimizerConfig(learning_rate=1e-6))

    def step() -> int:
        if variant == "grpo":
            return update_policy(model, optimizer, samples, settings, policy_version=0,
                                 device=device).trainable_tokens
        return full_sequence_update(model, optimizer, samples, args.micro_batch,
                                    settings.update.max_grad_norm, device)

    return measure(VARIANTS[variant], step, args.repeats, device)


def learner_arguments(parser: argparse.ArgumentParser, *, layers: int, variants: list[str]
                      ) -> argparse.ArgumentParser:
    """The batch and model shape every learner bench takes, and its child-process switch."""
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=96)
    parser.add_argument("--action-tokens", type=int, default=32)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=layers)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per process")
    parser.add_argument("--device", default=None, help="default: cuda when present, else cpu")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--variant", choices=variants, help=argparse.SUPPRESS)
    return parser


def main() -> None:
    parser = learner_arguments(argparse.ArgumentParser(description=__doc__.split("\n\n")[0]),
                               layers=2, variants=sorted(VARIANTS))
    args = parser.parse_args()
    if args.variant:  # child process: one variant, result as JSON on the last line
        print(json.dumps(asdict(run_variant(args, args.variant))))
        return
    # Each variant runs in its own process so neither inherits the other's allocator
    # state or peak memory.
    results = {}
    for variant in ("reference", "grpo"):
        child = subprocess.run(
            [sys.executable, __file__, *sys.argv[1:], "--variant", variant],
            check=True, capture_output=True, text=True,
        )
        results[variant] = Result(**json.loads(child.stdout.strip().splitlines()[-1]))
    device = torch.device(args.device) if args.device else select_device()
    report(args, device, results["grpo"], results["reference"])


def report(args: argparse.Namespace, device: torch.device, grpo: Result, ref: Result) -> None:
    ratios = {
        "seconds_per_update": grpo.seconds_per_update / ref.seconds_per_update,
        "trainable_tokens_per_second": grpo.tokens_per_second / ref.tokens_per_second,
        "peak_memory": (grpo.peak_memory_mib / ref.peak_memory_mib
                        if grpo.peak_memory_mib and ref.peak_memory_mib else None),
    }
    if args.json:
        print(json.dumps({
            "device": str(device), "config": vars(args),
            "results": [asdict(r) | {"tokens_per_second": r.tokens_per_second}
                        for r in (grpo, ref)],
            "ratios_grpo_over_reference": ratios,
        }, indent=2))
        return
    memory = "peak +MiB (CUDA alloc)" if device.type == "cuda" else "peak +MiB (RSS)"
    print(f"device {device}; batch {args.samples} x ({args.prompt_tokens} prompt +"
          f" {args.action_tokens} action) tokens; median of {args.repeats} updates")
    print(f"{'':36} {'s/update':>9} {'trainable tok':>13} {'tok/s':>10} {memory:>22}")
    for r in (grpo, ref):
        peak = f"{r.peak_memory_mib:.0f}" if r.peak_memory_mib is not None else "n/a"
        print(f"{r.name:36} {r.seconds_per_update:9.3f} {r.trainable_tokens:13d}"
              f" {r.tokens_per_second:10.0f} {peak:>22}")
    print(f"ratio GRPO / reference: time per update {ratios['seconds_per_update']:.2f}x,"
          f" trainable tokens/s {ratios['trainable_tokens_per_second']:.2f}x"
          + (f", peak memory {ratios['peak_memory']:.2f}x" if ratios["peak_memory"] else ""))


if __name__ == "__main__":
    main()
