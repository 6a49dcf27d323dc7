"""Learner peer benchmark: one triloop GRPO iteration against TRL's GRPOTrainer, same work.

Both sides train the same tiny model (`learning_loop.tiny_model.create_tiny_model`, written
to a temporary directory) on the same frozen-lake-like prompts with the same group size,
completion length, micro-batch, optimizer, clip range (0.2 / 0.28), token-level loss, no
KL term, and the same reward function: the share of generated characters that are one of
"LRUD". One iteration = sample a group of completions per prompt, score them, compute
group-normalised advantages, one optimizer step over all completions in micro-batches.

- triloop, batched generate: `model.generate` over the whole batch (as TRL samples), then
  `learning_loop.batch.build_training_samples` and `learning_loop.update.update_policy`.
- triloop, TorchPolicyClient: the execution loop's in-process sampler as a rollout worker
  uses it: every completion is its own request from its own thread (one episode activity
  each), and the client's batching engine decodes them in padded micro-batches; then the
  same update.
- TRL GRPOTrainer: `use_vllm=False`, fp32 and no gradient checkpointing (TRL defaults to
  bf16 and checkpointing; both are switched off so the arithmetic matches ours).

Each variant runs in its own process so the memory figures are comparable: peak resident
set of the whole process (imports included) and its growth during the measured loop over
what was resident once the model was loaded (CUDA: max allocated bytes instead).

    .venv/bin/python bench/trl_peer.py            # CPU default: about two minutes
    .venv/bin/python bench/trl_peer.py --group-size 16 --completion-tokens 64 --json

Needs the optional extra: pip install 'triloop[bench]'. Runs offline (HF_HUB_OFFLINE=1).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SKIP_MESSAGE = "skipped: trl not installed (pip install 'triloop[bench]')"
VARIANTS = {
    "generate": "triloop GRPO, batched generate",
    "client": "triloop GRPO, TorchPolicyClient",  # the shipped path: engine, one thread each
    "trl": "TRL GRPOTrainer",
}
ACTIONS = frozenset("LRUD")
LAKE = ("SFFF", "FHFH", "FFFH", "HFFG")


@dataclass(frozen=True)
class Result:
    name: str
    seconds_per_iteration: float  # wall clock
    cpu_seconds_per_iteration: float  # process CPU time: less sensitive to a busy machine
    sample_seconds: float  # generation, decoding, reward and advantages
    sample_cpu_seconds: float  # the same, in process CPU time (steadier on a shared machine)
    update_seconds: float  # forward/backward over the batch and the optimizer step
    completion_tokens: float  # per iteration, mean
    mean_reward: float
    peak_mib: float | None  # whole process (CPU: peak RSS) or CUDA max allocated
    loop_mib: float | None  # growth during the measured loop over the loaded model


def prompt_texts(tokenizer: Any, count: int) -> list[str]:
    """Frozen-lake-like single-step prompts, rendered with the model's chat template."""
    texts = []
    for i in range(count):
        row, col = divmod(i % 16, 4)
        content = (f"Frozen lake grid, map {'/'.join(LAKE)}. The player is at row {row}"
                   f" col {col}; the goal is at row 3 col 3. Move: answer L R U D.")
        texts.append(tokenizer.apply_chat_template(
            [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True))
    return texts


def action_share(completion: str) -> float:
    """The reward: share of the completion's characters that are a move letter."""
    return sum(c in ACTIONS for c in completion) / len(completion) if completion else 0.0


class Meter:
    """Peak memory: whole process, and growth after `start()`; CUDA when on a GPU."""

    def __init__(self, device: str) -> None:
        self.cuda = device.startswith("cuda")
        self.setup_peak = self._status("VmHWM:")
        self.base: float | None = None

    def start(self) -> None:
        import torch

        if self.cuda:
            self.base = torch.cuda.memory_allocated() / 2**20
            self.setup_peak = torch.cuda.max_memory_allocated() / 2**20
            torch.cuda.reset_peak_memory_stats()
            return
        self.setup_peak = self._status("VmHWM:")
        try:  # Linux: writing 5 resets the peak resident set to the current one
            Path("/proc/self/clear_refs").write_text("5")
            self.base = self._status("VmRSS:")
        except OSError:
            self.base = None

    def result(self) -> tuple[float | None, float | None]:
        import torch

        peak = (torch.cuda.max_memory_allocated() / 2**20 if self.cuda
                else self._status("VmHWM:"))
        if peak is None:
            return None, None
        total = max(peak, self.setup_peak or 0.0)
        return total, None if self.base is None else peak - self.base

    @staticmethod
    def _status(field: str) -> float | None:
        try:
            for line in Path("/proc/self/status").read_text().splitlines():
                if line.startswith(field):
                    return int(line.split()[1]) / 1024
        except OSError:
            return None
        return None


def run_triloop(args: argparse.Namespace, sampler: str) -> Result:
    """Our iteration: sample, score, advantages, update_policy; timed per phase."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from learning_loop.batch import StepRecord, build_training_samples
    from learning_loop.update import UpdateSettings, build_optimizer, update_policy
    from triloop.run_config import (
        AdvantageConfig,
        ObjectiveConfig,
        OptimizerConfig,
        UpdateConfig,
    )

    torch.manual_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir, padding_side="left")
    client = None
    episodes = None
    if sampler == "client":
        from concurrent.futures import ThreadPoolExecutor

        from execution_loop.inference.torch_backend import TorchPolicyClient

        client = TorchPolicyClient(args.model_dir, device=args.device)
        model = client.model
        # One thread per concurrent episode, as the execution worker's activity executor.
        episodes = ThreadPoolExecutor(max_workers=args.prompts * args.group_size)
    else:
        model = AutoModelForCausalLM.from_pretrained(args.model_dir).to(args.device)
    device = torch.device(args.device)
    optimizer, _ = build_optimizer(model, OptimizerConfig(learning_rate=args.learning_rate))
    settings = UpdateSettings(objective=ObjectiveConfig(clip_eps_low=0.2, clip_eps_high=0.28),
                              update=UpdateConfig(micro_batch_size=args.micro_batch))
    texts = prompt_texts(tokenizer, args.prompts * (args.warmup + args.iterations))
    prompt_ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    declared = model.generation_config.eos_token_id
    eos = {tokenizer.eos_token_id, *([declared] if isinstance(declared, int) else declared or [])}
    meter = Meter(args.device)
    timings: list[tuple[float, float, float, float]] = []  # sample s, update s, CPU s, sample CPU
    tokens: list[int] = []
    rewards: list[float] = []

    def sample(batch: list[list[int]], seed: int) -> list[tuple[list[int], list[float]]]:
        if client is not None and episodes is not None:
            futures = [episodes.submit(client.sample, p, max_new_tokens=args.completion_tokens,
                                       temperature=1.0, seed=seed + k)
                       for k, p in enumerate(batch)]
            out = [f.result() for f in futures]
            return [(s.token_ids, s.logprobs) for s in out]
        return batched_generate(model, tokenizer, batch, args.completion_tokens, eos, device)

    for it in range(args.warmup + args.iterations):
        if it == args.warmup:
            meter.start()
        started, cpu = time.perf_counter(), time.process_time()
        chosen = prompt_ids[it * args.prompts : (it + 1) * args.prompts]
        batch = [p for p in chosen for _ in range(args.group_size)]
        completions = sample(batch, seed=it * len(batch))
        steps = []
        for k, (prompt, (ids, logprobs)) in enumerate(zip(batch, completions, strict=True)):
            reward = action_share(str(tokenizer.decode(ids, skip_special_tokens=True)))
            steps.append(StepRecord(f"t{it}-{k}", f"g{it}-{k // args.group_size}", "lake", it,
                                    prompt, ids, logprobs, reward))
        samples, _ = build_training_samples(steps, AdvantageConfig())
        sampled, sampled_cpu = time.perf_counter(), time.process_time()
        update_policy(model, optimizer, samples, settings, policy_version=it, device=device,
                      pad_token_id=tokenizer.pad_token_id)
        if device.type == "cuda":
            torch.cuda.synchronize()
        if it >= args.warmup:
            timings.append((sampled - started, time.perf_counter() - sampled,
                            time.process_time() - cpu, sampled_cpu - cpu))
            tokens.append(sum(len(ids) for ids, _ in completions))
            rewards.extend(s.reward for s in steps)
    peak, loop = meter.result()
    return Result(VARIANTS[sampler], statistics.median(t[0] + t[1] for t in timings),
                  statistics.median(t[2] for t in timings),
                  statistics.median(t[0] for t in timings),
                  statistics.median(t[3] for t in timings),
                  statistics.median(t[1] for t in timings),
                  statistics.mean(tokens), statistics.mean(rewards), peak, loop)


def batched_generate(
    model: Any, tokenizer: Any, batch: list[list[int]], max_new: int, eos: set[int], device: Any,
) -> list[tuple[list[int], list[float]]]:
    """Left-padded batched sampling; returns each completion up to its first EOS, with logprobs."""
    import torch

    width = max(map(len, batch))
    pad = tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=device)
    model.eval()
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new,
                             do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                             output_logits=True, return_dict_in_generate=True)
    new = out.sequences[:, width:]
    logp = torch.log_softmax(torch.stack(out.logits, dim=1).float(), dim=-1)
    chosen = logp.gather(-1, new[..., None]).squeeze(-1)
    result = []
    for row, lps in zip(new.tolist(), chosen.tolist(), strict=True):
        end = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        result.append((row[:end], lps[:end]))
    return result


def run_trl(args: argparse.Namespace) -> Result:
    """TRL's GRPOTrainer with the same model, prompts, batch shape and objective."""
    from importlib.metadata import version

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer  # type: ignore[attr-defined]  # lazy exports

    torch.manual_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(args.model_dir).to(args.device)
    iterations = args.warmup + args.iterations
    tokens: list[int] = []
    rewards: list[float] = []

    def reward_fn(completions: list[str], completion_ids: list[list[int]],
                  **_: object) -> list[float | None]:
        scores = [action_share(c) for c in completions]
        tokens.append(sum(map(len, completion_ids)))
        rewards.append(statistics.mean(scores))
        return list(scores)

    completions_per_iteration = args.prompts * args.group_size
    config = GRPOConfig(
        output_dir=str(Path(args.model_dir).parent / "trl-out"), report_to="none",
        save_strategy="no", push_to_hub=False, logging_strategy="no", disable_tqdm=True,
        use_vllm=False, use_cpu=args.device == "cpu", bf16=False, fp16=False,
        gradient_checkpointing=False, seed=args.seed, max_steps=iterations,
        per_device_train_batch_size=args.micro_batch,
        gradient_accumulation_steps=completions_per_iteration // args.micro_batch,
        num_generations=args.group_size, max_completion_length=args.completion_tokens,
        temperature=1.0, top_k=0, top_p=1.0, shuffle_dataset=False,
        learning_rate=args.learning_rate, lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=0.0, max_grad_norm=1.0, beta=0.0, epsilon=0.2, epsilon_high=0.28,
        loss_type="dapo", scale_rewards="group", dataloader_num_workers=0,
    )
    dataset = Dataset.from_dict({"prompt": prompt_texts(tokenizer, args.prompts * iterations)})
    meter = Meter(args.device)
    marks: list[tuple[float, float, float, float]] = []  # wall, CPU, generation, its CPU
    generation = [0.0, 0.0]

    class Clock(TrainerCallback):
        def on_step_begin(self, *_: object, **__: object) -> None:
            if len(marks) == args.warmup:
                meter.start()
            generation[0] = generation[1] = 0.0
            marks.append((time.perf_counter(), time.process_time(), 0.0, 0.0))

        def on_step_end(self, *_: object, **__: object) -> None:
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            begun, cpu, _generated, _generated_cpu = marks[-1]
            marks[-1] = (time.perf_counter() - begun, time.process_time() - cpu, generation[0],
                         generation[1])

    class TimedTrainer(GRPOTrainer):
        # Generation and scoring happen inside the training step; time them to split it.
        def _generate_and_score_completions(self, inputs: Any) -> Any:
            started, cpu = time.perf_counter(), time.process_time()
            try:
                return super()._generate_and_score_completions(inputs)
            finally:
                generation[0] += time.perf_counter() - started
                generation[1] += time.process_time() - cpu

    trainer = TimedTrainer(model=model, reward_funcs=reward_fn, args=config,
                           train_dataset=dataset, processing_class=tokenizer, callbacks=[Clock()])
    trainer.train()
    peak, loop = meter.result()
    measured = marks[args.warmup :]
    return Result(f"{VARIANTS['trl']} {version('trl')}",
                  statistics.median(m[0] for m in measured),
                  statistics.median(m[1] for m in measured),
                  statistics.median(m[2] for m in measured),
                  statistics.median(m[3] for m in measured),
                  statistics.median(m[0] - m[2] for m in measured),
                  statistics.mean(tokens[args.warmup :]), statistics.mean(rewards[args.warmup :]),
                  peak, loop)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=4, help="distinct prompts per iteration")
    parser.add_argument("--group-size", type=int, default=8, help="completions per prompt")
    parser.add_argument("--completion-tokens", type=int, default=32, help="max new tokens")
    parser.add_argument("--micro-batch", type=int, default=8, help="completions per forward")
    parser.add_argument("--iterations", type=int, default=5, help="measured iterations")
    parser.add_argument("--rounds", type=int, default=2,
                        help="fresh processes per variant, interleaved; the best one is shown")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured iterations first")
    parser.add_argument("--hidden", type=int, default=64, help="tiny model width")
    parser.add_argument("--layers", type=int, default=2, help="tiny model depth")
    parser.add_argument("--learning-rate", type=float, default=1e-6)
    parser.add_argument("--threads", type=int, default=1, help="CPU threads for torch")
    parser.add_argument("--device", default=None, help="default: cuda when present, else cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--variant", choices=sorted(VARIANTS), help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if importlib.util.find_spec("trl") is None:
        print(SKIP_MESSAGE)
        return 0
    if (args.prompts * args.group_size) % args.micro_batch:
        parser.error("--prompts x --group-size must be a multiple of --micro-batch")
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.variant:  # child process: one variant, result as JSON on the last line
        import torch

        torch.set_num_threads(args.threads)
        result = run_trl(args) if args.variant == "trl" else run_triloop(args, args.variant)
        print(json.dumps(asdict(result)))
        return 0
    return run_all(args)


def run_all(args: argparse.Namespace) -> int:
    """Create the model once, run each variant in a fresh process, print the comparison."""
    from learning_loop.tiny_model import TinyModelSpec, create_tiny_model, tiny_model_info

    heads = max(1, args.hidden // 32)
    spec = TinyModelSpec(hidden_size=args.hidden, intermediate_size=4 * args.hidden,
                         num_hidden_layers=args.layers, num_attention_heads=heads,
                         num_key_value_heads=max(1, heads // 2))
    runs: dict[str, list[Result]] = {variant: [] for variant in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="triloop-trl-peer-") as tmp:
        model_dir = create_tiny_model(Path(tmp) / "model", seed=args.seed, spec=spec)
        parameters = tiny_model_info(model_dir).num_parameters
        forwarded = [a for a in sys.argv[1:] if a != "--json"]
        # Rounds interleave the variants so a busy spell on a shared machine hits all of them.
        for variant in [v for _ in range(args.rounds) for v in ("generate", "client", "trl")]:
            child = subprocess.run(
                [sys.executable, __file__, *forwarded, "--device", args.device,
                 "--variant", variant, "--model-dir", str(model_dir)],
                capture_output=True, text=True, check=False,
            )
            if child.returncode:
                print(f"{VARIANTS[variant]} failed (exit {child.returncode}):\n"
                      f"{child.stderr[-4000:]}", file=sys.stderr)
                return 1
            runs[variant].append(Result(**json.loads(child.stdout.strip().splitlines()[-1])))
    # Each variant's best round: other load on the machine only ever adds time.
    results = {v: min(r, key=lambda x: x.seconds_per_iteration) for v, r in runs.items()}
    report(args, parameters, results)
    return 0


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def report(args: argparse.Namespace, parameters: int, results: dict[str, Result]) -> None:
    ours, theirs = results["generate"], results["trl"]
    ratios = {
        "seconds_per_iteration": _ratio(theirs.seconds_per_iteration, ours.seconds_per_iteration),
        "cpu_seconds_per_iteration": _ratio(theirs.cpu_seconds_per_iteration,
                                            ours.cpu_seconds_per_iteration),
        "sample_seconds": _ratio(theirs.sample_seconds, ours.sample_seconds),
        "update_seconds": _ratio(theirs.update_seconds, ours.update_seconds),
        "peak_memory": _ratio(theirs.peak_mib, ours.peak_mib),
        "loop_memory_growth": _ratio(theirs.loop_mib, ours.loop_mib),
    }
    if args.json:
        print(json.dumps({"device": args.device, "parameters": parameters, "config": vars(args),
                          "results": [asdict(r) for r in results.values()],
                          "ratios_trl_over_triloop_generate": ratios,
                          "sampling_tokens_per_s": {
                              name: r.completion_tokens / r.sample_seconds
                              for name, r in results.items()},
                          "sampling_tokens_per_cpu_s": {
                              name: r.completion_tokens / r.sample_cpu_seconds
                              for name, r in results.items()}}, indent=2))
        return
    unit = "CUDA alloc" if args.device.startswith("cuda") else "RSS"
    print(f"device {args.device}; tiny model {parameters / 1e3:.0f}k parameters; {args.prompts}"
          f" prompts x group {args.group_size} = {args.prompts * args.group_size} completions of"
          f" <= {args.completion_tokens} tokens; micro-batch {args.micro_batch}, one optimizer"
          f" step per iteration; median of {args.iterations} after {args.warmup} warm-up, best of"
          f" {args.rounds} rounds")
    print(f"{'':38} {'s/iter':>7} {'CPU s':>7} {'sample':>7} {'update':>7} {'tokens':>7}"
          f" {'reward':>6} {'peak MiB':>9} {'+MiB loop':>9}  ({unit})")
    for r in results.values():
        peak = f"{r.peak_mib:.0f}" if r.peak_mib is not None else "n/a"
        loop = f"{r.loop_mib:.0f}" if r.loop_mib is not None else "n/a"
        print(f"{r.name:38} {r.seconds_per_iteration:7.3f} {r.cpu_seconds_per_iteration:7.3f}"
              f" {r.sample_seconds:7.3f}"
              f" {r.update_seconds:7.3f} {r.completion_tokens:7.0f} {r.mean_reward:6.3f}"
              f" {peak:>9} {loop:>9}")
    shown = {k: f"{v:.2f}x" if v is not None else "n/a" for k, v in ratios.items()}
    shipped = results["client"]
    for label, seconds in (("wall", "sample_seconds"), ("CPU", "sample_cpu_seconds")):
        rates = {name: r.completion_tokens / getattr(r, seconds) for name, r in results.items()}
        print(f"sampling tokens per {label} s: batched generate {rates['generate']:.0f},"
              f" TorchPolicyClient (shipped: batching engine, {args.prompts * args.group_size}"
              f" concurrent requests) {rates['client']:.0f}, TRL {rates['trl']:.0f}; shipped /"
              f" batched generate {rates['client'] / rates['generate']:.2f}x (goal >= 0.8x),"
              f" shipped / TRL {rates['client'] / rates['trl']:.2f}x (goal >= 1x)")
    wall = theirs.seconds_per_iteration / shipped.seconds_per_iteration
    cpu = theirs.cpu_seconds_per_iteration / shipped.cpu_seconds_per_iteration
    print(f"time per iteration TRL / shipped {wall:.2f}x (CPU {cpu:.2f}x)")
    print(f"ratio TRL / triloop (batched generate): time per iteration"
          f" {shown['seconds_per_iteration']} (CPU time {shown['cpu_seconds_per_iteration']}),"
          f" sampling {shown['sample_seconds']}, update"
          f" {shown['update_seconds']}, peak memory {shown['peak_memory']}, memory growth in the"
          f" loop {shown['loop_memory_growth']}")


if __name__ == "__main__":
    sys.exit(main())
