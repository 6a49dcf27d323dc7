"""Learner options benchmark: time per update and peak memory for each update option.

One fixed batch and model (as in ``bench/learner.py``), one GRPO update per step, for:
fp32 in one process (the baseline), bf16 autocast, activation checkpointing, and
``update.world_size`` 2 (two torchrun ranks, gloo on CPU or nccl on GPUs, each training
on its shard with the gradients summed: the shipped ``learning_loop.data_parallel``
path). Each variant runs in its own process(es); results are printed as ratios against
fp32 single rank measured in the same run.

    .venv/bin/python bench/learner_options.py          # CPU: a few minutes
    .venv/bin/python bench/learner_options.py --layers 8 --samples 64

Peak memory is what an update needs above what was in use before it: CUDA's max
allocated bytes on a GPU; on CPU the growth of the process's peak resident set (VmHWM),
which the allocator makes noisy at this size. So it also prints the peak of the
activations autograd keeps for the backward (saved-tensor hooks, live bytes at once):
what bf16 and checkpointing act on, the same on any machine.
For two ranks it is per rank (each holds a full replica), the larger of the two, and the
time per update is rank 0's. On CPU each rank gets ``--threads`` threads, so two ranks
use twice the cores of the baseline: the ratio shows what a second device buys.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import weakref
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from bench.learner import Result, learner_arguments, make_model, make_samples, measure
from learning_loop.update import (
    UpdateSettings,
    build_optimizer,
    select_device,
    update_policy,
)
from learning_loop.update_options import apply_update_options
from triloop.devstack.processes import free_port
from triloop.run_config import OptimizerConfig, UpdateConfig

VARIANTS = {
    "fp32": "fp32, 1 rank (baseline)",
    "bf16": "bf16 autocast, 1 rank",
    "checkpointing": "activation checkpointing, 1 rank",
    "ranks2": "fp32, world_size 2",
}


def run_variant(args: argparse.Namespace, variant: str) -> OptionResult:
    """Time one variant in this process (for ``ranks2``: as this torchrun rank)."""
    torch.set_num_threads(args.threads)
    ranks = None
    device = torch.device(args.device) if args.device else select_device()
    if variant == "ranks2":
        import torch.distributed as dist

        from learning_loop.data_parallel import RankGroup

        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
            torch.cuda.set_device(device)
        dist.init_process_group(backend)
        ranks = RankGroup(dist.get_rank(), dist.get_world_size(), device)
    samples = make_samples(args.samples, args.prompt_tokens, args.action_tokens, args.vocab)
    model = make_model(args.vocab, args.hidden, args.layers, device)
    options = UpdateConfig(bf16_autocast=variant == "bf16",
                           gradient_checkpointing=variant == "checkpointing")
    apply_update_options(options, device, model, None)
    settings = UpdateSettings(update=UpdateConfig(micro_batch_size=args.micro_batch))
    optimizer, _ = build_optimizer(model, OptimizerConfig(learning_rate=1e-6))

    saved = SavedActivations()

    def step() -> int:
        with saved.hooks():
            return update_policy(model, optimizer, samples, settings, policy_version=0,
                                 device=device, ranks=ranks).trainable_tokens

    result = measure(VARIANTS[variant], step, args.repeats, device)
    if ranks is not None:
        import torch.distributed as dist

        dist.destroy_process_group()
    return OptionResult(**asdict(result), saved_activations_mib=saved.peak / 2**20)


@dataclass(frozen=True)
class OptionResult(Result):
    saved_activations_mib: float = 0.0  # peak of what autograd kept for the backward


class SavedActivations:
    """Peak bytes of tensors autograd holds for the backward (live at once), per update.

    Steadier than the resident set on CPU, and what bf16 and checkpointing act on: each
    saved tensor is wrapped on the way in and counted until autograd lets go of it.
    Tensors a checkpointed region saves are the checkpoint's own (recomputed later), so
    only what it keeps is counted.
    """

    def __init__(self) -> None:
        self.live = self.peak = 0

    def _pack(self, tensor: torch.Tensor) -> _Held:
        held = _Held(tensor)
        size = tensor.numel() * tensor.element_size()
        self.live += size
        self.peak = max(self.peak, self.live)
        weakref.finalize(held, self._release, size)
        return held

    def _release(self, size: int) -> None:
        self.live -= size

    def hooks(self) -> torch.autograd.graph.saved_tensors_hooks:
        return torch.autograd.graph.saved_tensors_hooks(self._pack, lambda held: held.tensor)


class _Held:
    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


def _child_args(argv: list[str]) -> list[str]:
    return [a for a in argv if a != "--json"]


def run_ranks2(argv: list[str]) -> OptionResult:
    """Two torchrun ranks on this machine (loopback); rank 0's time, the larger peak."""
    with tempfile.TemporaryDirectory(prefix="bench-ranks-") as out:
        env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", NCCL_SOCKET_IFNAME="lo")
        subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes=1",
             "--nproc-per-node=2", "--master-addr=127.0.0.1", f"--master-port={free_port()}",
             __file__, *_child_args(argv), "--variant", "ranks2", "--out", out],
            check=True, capture_output=True, text=True, env=env,
        )
        results = [OptionResult(**json.loads(p.read_text()))
                   for p in sorted(Path(out).glob("*.json"))]
    peaks = [r.peak_memory_mib for r in results if r.peak_memory_mib is not None]
    rank0 = results[0]
    return OptionResult(rank0.name, rank0.seconds_per_update, rank0.trainable_tokens,
                        max(peaks) if peaks else None,
                        max(r.saved_activations_mib for r in results))


def main() -> None:
    parser = learner_arguments(argparse.ArgumentParser(description=__doc__.split("\n\n")[0]),
                               layers=4, variants=sorted(VARIANTS))
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:  # a child: one variant, result as JSON (a file per rank for ranks2)
        result = json.dumps(asdict(run_variant(args, args.variant)))
        if args.out:
            Path(args.out, f"rank-{os.environ.get('RANK', '0')}.json").write_text(result)
        else:
            print(result)
        return
    results: dict[str, OptionResult] = {}
    for variant in VARIANTS:
        if variant == "ranks2":
            results[variant] = run_ranks2(sys.argv[1:])
            continue
        child = subprocess.run(
            [sys.executable, __file__, *_child_args(sys.argv[1:]), "--variant", variant],
            check=True, capture_output=True, text=True,
        )
        results[variant] = OptionResult(**json.loads(child.stdout.strip().splitlines()[-1]))
    report(args, results)


def report(args: argparse.Namespace, results: dict[str, OptionResult]) -> None:
    device = torch.device(args.device) if args.device else select_device()
    base = results["fp32"]
    ratios = {
        name: {
            "seconds_per_update": r.seconds_per_update / base.seconds_per_update,
            "peak_memory": (r.peak_memory_mib / base.peak_memory_mib
                            if r.peak_memory_mib and base.peak_memory_mib else None),
            "saved_activations": r.saved_activations_mib / base.saved_activations_mib,
        } for name, r in results.items()
    }
    if args.json:
        print(json.dumps({"device": str(device), "config": vars(args),
                          "results": {k: asdict(r) for k, r in results.items()},
                          "ratios_over_fp32": ratios}, indent=2))
        return
    memory = "peak +MiB (CUDA alloc)" if device.type == "cuda" else "peak +MiB (RSS)"
    print(f"device {device}; batch {args.samples} x ({args.prompt_tokens} prompt +"
          f" {args.action_tokens} action) tokens; hidden {args.hidden}, {args.layers} layers;"
          f" {args.threads} thread(s) per process; median of {args.repeats} updates")
    print(f"{'':34} {'s/update':>9} {'x fp32':>7} {memory:>22} {'x fp32':>7}"
          f" {'saved for bwd MiB':>18} {'x fp32':>7}")
    for name, r in results.items():
        peak = f"{r.peak_memory_mib:.0f}" if r.peak_memory_mib is not None else "n/a"
        memory_ratio = ratios[name]["peak_memory"]
        print(f"{r.name:34} {r.seconds_per_update:9.3f} "
              f"{ratios[name]['seconds_per_update']:6.2f}x {peak:>22} "
              + (f"{memory_ratio:6.2f}x" if memory_ratio is not None else "    n/a")
              + f" {r.saved_activations_mib:18.1f} {ratios[name]['saved_activations']:6.2f}x")
    print("world_size 2: rank 0's time; peak memory per rank (each holds a full replica)")


if __name__ == "__main__":
    main()
