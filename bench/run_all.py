"""Run every benchmark in one go and write ``bench/RESULTS.md`` with the machine's description.

Each benchmark is its own script and prints its own table with ratios against a
baseline or peer measured in the same run; this runner only collects their
output. A benchmark that fails is reported as failed, and the others still run.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from pathlib import Path

BENCHMARKS: tuple[tuple[str, list[str]], ...] = (
    ("Policy decisions (OPA over loopback)", ["bench/policy.py", "--requests", "1000"]),
    ("Rollouts: Temporal vs plain loop; trajectory ingest", ["bench/rollout.py"]),
    ("Learner: GRPO update vs unmasked full-sequence loss", ["bench/learner.py"]),
    ("Trajectory layout: one prompt per step vs one sequence per episode",
     ["bench/sequence_layout.py"]),
    ("Black-box trajectories: one prompt per model call vs the session's one sequence",
     ["bench/black_box_bytes.py"]),
    ("Learner options: bf16, activation checkpointing, 2 ranks vs fp32",
     ["bench/learner_options.py"]),
    ("Learner: triloop GRPO iteration vs TRL GRPOTrainer", ["bench/trl_peer.py"]),
    ("Whole iteration: TrainingRunWorkflow vs TRL GRPOTrainer", ["bench/iteration.py"]),
    ("Rollback: request to effective", ["bench/rollback.py"]),
    ("Scale: concurrent short episodes", ["bench/scale.py"]),
    ("Gates: simulated canary and watch error rates", ["bench/gate_calibration.py"]),
    ("Asynchrony: simulated rollout/update overlap at k = 1, 2, 4", ["bench/overlap.py"]),
    ("Asynchrony: measured rollout/update overlap at k = 1, 2, 4",
     ["bench/overlap_measured.py"]),
)


# Too long for every `make bench` (about half an hour on 2 cores): run with --long. Without
# it their last recorded sections in RESULTS.md are kept as they are.
LONG_BENCHMARKS: tuple[tuple[str, list[str]], ...] = (
    ("Real model: SmolLM2-135M-Instruct, triloop vs TRL GRPOTrainer (LoRA)",
     ["bench/real_model.py"]),
)


def recorded_sections(results: Path) -> dict[str, str]:
    """The sections of an existing RESULTS.md by title, to keep those not rerun."""
    if not results.is_file():
        return {}
    parts = results.read_text().split("\n## ")[1:]
    return {part.split("\n", 1)[0]: "## " + part.rstrip() + "\n" for part in parts}


def machine_description() -> str:
    """One line naming the machine the numbers come from."""
    try:
        import psutil

        memory = f"{psutil.virtual_memory().total / 2**30:.0f} GiB"
    except ImportError:
        memory = "unknown memory"
    return (
        f"{platform.node()}: {platform.machine()}, {os.cpu_count()} CPU cores, {memory}, "
        f"Python {platform.python_version()}, {platform.platform()}"
    )


def run_one(title: str, argv: list[str], root: Path) -> str:
    """Run one benchmark; return its Markdown section."""
    script = root / argv[0]
    if not script.exists():
        return f"## {title}\n\nnot run: {argv[0]} does not exist\n"
    started = time.monotonic()
    print(f"== {title}", flush=True)
    result = subprocess.run(
        [sys.executable, *argv], cwd=root, capture_output=True, text=True, check=False,
        timeout=1800,
    )
    elapsed = time.monotonic() - started
    output = (result.stdout + ("\n" + result.stderr if result.returncode else "")).strip()
    print(output, flush=True)
    status = "ok" if result.returncode == 0 else f"FAILED (exit {result.returncode})"
    command = " ".join(argv)
    return f"## {title}\n\n`python {command}`: {status}, {elapsed:.0f} s\n\n```\n{output}\n```\n"


def main() -> int:
    """Run all benchmarks; write the results file."""
    root = Path(__file__).resolve().parents[1]
    results = root / "bench" / "RESULTS.md"
    kept = recorded_sections(results)
    sections = [run_one(title, argv, root) for title, argv in BENCHMARKS]
    for title, argv in LONG_BENCHMARKS:
        if "--long" in sys.argv[1:]:
            sections.append(run_one(title, argv, root))
        elif title in kept:
            sections.append(kept[title])
    header = (
        "# Benchmark results\n\n"
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} "
        f"on {machine_description()}.\n"
        "Every ratio compares against a baseline or peer measured in the same run.\n"
        "Rerun with `make bench`; the long ones with `python bench/run_all.py --long`.\n\n"
    )
    results.write_text(header + "\n".join(sections))
    print(f"wrote {results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
