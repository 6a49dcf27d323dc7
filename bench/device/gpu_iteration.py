"""One prepared GPU check: a GRPO iteration on CUDA in bf16, rollout through the batching engine.

For a session that is lent a GPU machine. It builds a small Llama locally (no download),
then runs ``--iterations`` iterations of: sample ``--prompts`` x ``--group-size``
completions through ``TorchPolicyClient`` (the shipped path: one thread per completion,
the checkpoint's batching engine decodes them in micro-batches), score them, build GRPO
samples, and update two learners on them, each timed between CUDA synchronisations with
its own peak memory: one with ``update.bf16_autocast`` (the shipped option,
``learning_loop.update_options``), whose weights then serve the next rollout, and an
fp32 twin as the baseline. It also times one batched ``model.generate`` of the
same prompts, so the engine's rate has its baseline in the same run. It prints one line
per iteration and a summary: sampling tokens/s (engine and generate, and their ratio),
bf16 and fp32 update seconds and peak CUDA memory (and their ratios), trainable tokens/s.

Without CUDA it prints why it skipped and exits 0: this machine cannot say anything about
the GPU path. Budget: under 5 minutes on one GPU with the defaults (most of it start-up).

    .venv/bin/python bench/device/gpu_iteration.py [--iterations 3] [--hidden 512]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SKIP = "skipped: no CUDA device here (torch.cuda.is_available() is False); run on a GPU machine"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=3, help="measured, after 1 warm-up")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--completion-tokens", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=512, help="model width")
    parser.add_argument("--layers", type=int, default=8, help="model depth")
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--checkpointing", action="store_true",
                        help="also turn on update.gradient_checkpointing for the bf16 learner")
    parser.add_argument("--cpu-dry-run", action="store_true",
                        help="run the same code on CPU (bf16 autocast on CPU) to check the script")
    args = parser.parse_args()

    import torch

    if args.cpu_dry_run:
        return run(args, "cpu")
    if not torch.cuda.is_available():
        print(SKIP)
        return 0
    return run(args, "cuda")


def run(args: argparse.Namespace, device_name: str) -> int:
    import copy

    import torch
    from transformers import AutoTokenizer

    from bench.trl_peer import action_share, batched_generate, prompt_texts
    from execution_loop.inference.torch_backend import TorchPolicyClient
    from learning_loop.batch import StepRecord, build_training_samples
    from learning_loop.tiny_model import TinyModelSpec, create_tiny_model
    from learning_loop.update import UpdateSettings, build_optimizer, update_policy
    from learning_loop.update_options import apply_update_options
    from triloop.run_config import AdvantageConfig, ObjectiveConfig, OptimizerConfig, UpdateConfig

    device = torch.device(device_name)
    cuda = device.type == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def peak_mib() -> float:
        return torch.cuda.max_memory_allocated() / 2**20 if cuda else float("nan")

    heads = max(1, args.hidden // 64)
    spec = TinyModelSpec(hidden_size=args.hidden, intermediate_size=4 * args.hidden,
                         num_hidden_layers=args.layers, num_attention_heads=heads,
                         num_key_value_heads=max(1, heads // 2))
    with tempfile.TemporaryDirectory(prefix="triloop-gpu-") as tmp:
        model_dir = create_tiny_model(Path(tmp) / "model", seed=0, spec=spec)
        client = TorchPolicyClient(model_dir, device=device_name, max_batch_size=256)
        model = client.model
        parameters = sum(p.numel() for p in model.parameters())
        tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
        # The bf16 learner (the shipped option) feeds the sampler; fp32 is the baseline twin.
        learners = {"bf16": copy.deepcopy(model), "fp32": copy.deepcopy(model)}
        apply_update_options(UpdateConfig(bf16_autocast=True,
                                          gradient_checkpointing=args.checkpointing),
                             device, learners["bf16"])
        optimizers = {k: build_optimizer(m, OptimizerConfig(learning_rate=1e-5))[0]
                      for k, m in learners.items()}
        settings = UpdateSettings(objective=ObjectiveConfig(),
                                  update=UpdateConfig(micro_batch_size=args.micro_batch))
        width = args.prompts * args.group_size
        episodes = ThreadPoolExecutor(max_workers=width)
        texts = prompt_texts(tokenizer, args.prompts)
        prompts = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
        batch = [p for p in prompts for _ in range(args.group_size)]
        eos = {tokenizer.eos_token_id}
        where = torch.cuda.get_device_name() if cuda else "cpu (dry run)"
        print(f"device {where}; model {parameters / 1e6:.1f}M parameters;"
              f" {width} completions of <= {args.completion_tokens} tokens per iteration;"
              " updates: bf16 autocast (shipped option) and fp32"
              + (", bf16 with activation checkpointing" if args.checkpointing else ""))
        rows = []
        for iteration in range(1 + args.iterations):
            sync()
            started = time.perf_counter()
            futures = [episodes.submit(client.sample, p, max_new_tokens=args.completion_tokens,
                                       temperature=1.0, seed=iteration * width + k)
                       for k, p in enumerate(batch)]
            samples_out = [f.result() for f in futures]
            sync()
            sampled = time.perf_counter()
            generated = batched_generate(model, tokenizer, batch, args.completion_tokens, eos,
                                         device)
            sync()
            generate_s = time.perf_counter() - sampled
            steps = [StepRecord(f"t{iteration}-{k}", f"g{k // args.group_size}", "lake",
                                iteration, prompt, s.token_ids, s.logprobs,
                                action_share(str(tokenizer.decode(s.token_ids,
                                                                  skip_special_tokens=True))))
                     for k, (prompt, s) in enumerate(zip(batch, samples_out, strict=True))]
            training, _ = build_training_samples(steps, AdvantageConfig())
            timed = {}
            for kind in ("bf16", "fp32"):
                if cuda:
                    torch.cuda.reset_peak_memory_stats()
                sync()
                update_started = time.perf_counter()
                metrics = update_policy(learners[kind], optimizers[kind], training, settings,
                                        policy_version=iteration, device=device,
                                        pad_token_id=tokenizer.pad_token_id)
                sync()
                timed[kind] = (time.perf_counter() - update_started, peak_mib(), metrics)
            with torch.no_grad():  # the next rollout samples from the bf16-trained policy
                model.load_state_dict(learners["bf16"].state_dict())
            update_s, peak, metrics = timed["bf16"]
            fp32_s, fp32_peak, fp32_metrics = timed["fp32"]
            tokens = sum(len(s.token_ids) for s in samples_out)
            generate_tokens = sum(len(ids) for ids, _ in generated)
            row = (sampled - started, tokens, generate_s, generate_tokens, update_s,
                   metrics.trainable_tokens, peak, fp32_s, fp32_peak)
            label = "warm-up" if iteration == 0 else f"iter {iteration}"
            print(f"{label:8} sample {row[0]:6.3f} s ({tokens / row[0]:8.0f} tok/s)  generate"
                  f" {generate_s:6.3f} s ({generate_tokens / generate_s:8.0f} tok/s)  update"
                  f" bf16 {update_s:6.3f} s peak {peak:8.0f} MiB loss {metrics.loss:+.4f} |"
                  f" fp32 {fp32_s:6.3f} s peak {fp32_peak:8.0f} MiB"
                  f" loss {fp32_metrics.loss:+.4f}")
            if iteration:
                rows.append(row)
        episodes.shutdown()
        client.close()
    engine_rate = statistics.median(r[1] / r[0] for r in rows)
    generate_rate = statistics.median(r[3] / r[2] for r in rows)
    update_s = statistics.median(r[4] for r in rows)
    fp32_s = statistics.median(r[7] for r in rows)
    bf16_peak, fp32_peak = max(r[6] for r in rows), max(r[8] for r in rows)
    print(f"summary: sampling {engine_rate:.0f} tok/s through the batching engine vs"
          f" {generate_rate:.0f} tok/s batched generate ({engine_rate / generate_rate:.2f}x,"
          f" goal >= 0.8x); bf16 update {update_s:.3f} s"
          f" ({statistics.median(r[5] for r in rows) / update_s:.0f} trainable tok/s);"
          f" peak CUDA memory {bf16_peak:.0f} MiB (nan: CPU); fp32 update {fp32_s:.3f} s,"
          f" {fp32_peak:.0f} MiB; bf16 / fp32: time {update_s / fp32_s:.2f}x,"
          f" peak memory {bf16_peak / fp32_peak:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
