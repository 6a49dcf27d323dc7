"""The real-model benchmark and the GPU check cannot rot: their smoke and dry runs run here.

``bench/real_model.py --smoke`` drives the whole script (import of a base through the
model-import code, triloop's engine and learner with LoRA, TRL's GRPOTrainer with peft,
the shared evaluator, the table's summary) on the tiny random model for one iteration;
``bench/device/gpu_iteration.py --cpu-dry-run`` runs the GPU check's code on this CPU.
Nothing here reads a timing: only that every figure is there and well-formed.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.real_model import LORA_TARGETS, parse_args, split_problems, success

ROOT = Path(__file__).resolve().parents[2]
needs_trl = pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="trl missing")


def test_held_out_problems_share_no_pair_with_training() -> None:
    train, heldout = split_problems(4000, 64)
    seen = {frozenset((p.a, p.b)) for p in train}
    assert len(heldout) == 64 and len(train) == 4000
    assert not seen & {frozenset((p.a, p.b)) for p in heldout}
    assert all(10 <= n <= 99 for p in [*train, *heldout] for n in (p.a, p.b))


def test_success_is_the_exact_last_integer_of_the_reply() -> None:
    assert success("23 + 45 = 68", 68) == 1.0
    assert success("The answer is 68.", 68) == 1.0
    assert success("68, or rather 67", 68) == 0.0
    assert success("sixty-eight", 68) == 0.0
    assert success("1,068", 1068) == 1.0


def test_the_bench_flags_say_what_runs() -> None:
    args = parse_args([])
    assert args.mode == "lora" and args.learning_rate == 2e-4 and len(args.seeds) >= 3
    assert parse_args(["--mode", "full"]).learning_rate == 5e-6
    smoke = parse_args(["--smoke"])
    assert (smoke.iterations, smoke.seeds) == (1, [0])
    with pytest.raises(SystemExit):
        parse_args(["--prompts", "3", "--group-size", "3", "--micro-batch", "2"])
    assert "q_proj" in LORA_TARGETS


@needs_trl
def test_the_real_model_bench_smoke_run_prints_every_figure() -> None:
    done = subprocess.run([sys.executable, "bench/real_model.py", "--smoke", "--json"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout[done.stdout.index("{"):])
    assert 0.0 <= summary["heldout_before"] <= 1.0
    for name in ("triloop", "trl"):
        framework = summary["frameworks"][name]
        assert set(framework["seconds"]) == {"rollout", "update", "checkpoint", "total"}
        assert framework["seconds"]["total"] > 0 and framework["peak_mib"] > 0
        assert len(framework["per_seed"]) == 1
        assert len(framework["per_seed"][0]["train_success"]) == 1
    assert summary["frameworks"]["triloop"]["seconds"]["checkpoint"] > 0
    assert summary["ratios"]["time_per_iteration_triloop_over_trl"] > 0
    assert summary["config"]["mode"] == "lora"


def test_the_smollm2_shape_has_the_real_models_parameter_count() -> None:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from bench.device.gpu_iteration import SMOLLM2_SHAPE

    with torch.device("meta"):  # shapes only: nothing allocated
        model = AutoModelForCausalLM.from_config(LlamaConfig(**SMOLLM2_SHAPE))
    assert sum(p.numel() for p in model.parameters()) == 134_515_008


def test_the_gpu_check_dry_run_covers_bf16_lora_and_checkpoints_on_cpu() -> None:
    done = subprocess.run(
        [sys.executable, "bench/device/gpu_iteration.py", "--cpu-dry-run", "--hidden", "64",
         "--layers", "2", "--iterations", "1", "--prompts", "2", "--group-size", "2",
         "--completion-tokens", "8", "--micro-batch", "2"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "cpu (dry run)" in done.stdout and "tiny shape" in done.stdout
    summary = done.stdout.splitlines()[-1]
    assert summary.startswith("summary:")
    for figure in ("bf16 update", "LoRA update", "fp32 update", "adapter"):
        assert figure in summary
