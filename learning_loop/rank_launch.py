"""Launch a multi-rank policy update with torchrun and collect what rank 0 saved.

``run_ranks`` writes the job (parent checkpoint, samples, run config) into a private
working directory under the artifact directory, starts ``python -m torch.distributed.run``
with one process per rank on this machine (rendezvous on 127.0.0.1 at a free port, the
ranks' own traffic on the loopback interface too), and waits. Each rank runs
``learning_loop.rank_update``; rank 0 saves the updated checkpoint once
(atomically: a staging directory renamed to its content id) and writes the update's
metrics. Each rank's stdout and stderr go to its own log in the working directory.

A failed rank becomes a ``RankFailed`` that names the rank that failed first, its error
and the tail of its log; the working directory is removed whatever happens, and a
checkpoint exists only if rank 0 finished saving it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

import learning_loop
from learning_loop.batch import TrainingSample
from learning_loop.checkpoints import CheckpointRef
from learning_loop.update import OffPolicyReport, UpdateError, UpdateMetrics
from triloop.devstack.processes import free_port
from triloop.run_config import RunConfig, UpdateConfig

RANK_MODULE = "learning_loop.rank_update"
JOB_FILE, RESULT_FILE = "job.json", "result.json"
_TAIL_CHARS = 2000
_STOP_GRACE_S = 10.0


class RankFailed(RuntimeError):
    """A rank of a multi-rank update failed; the message names it and quotes its log.

    ``python_error`` is true when the rank raised an exception (the same code on the same
    data fails again: not worth retrying), false when it died without one (killed, out
    of memory, a lost peer, the time limit).
    """

    def __init__(self, message: str, *, rank: int | None, python_error: bool) -> None:
        super().__init__(message)
        self.rank = rank
        self.python_error = python_error


@dataclass(frozen=True)
class RankJob:
    """Everything the ranks need to run the update train_iteration would run in-process."""

    artifact_dir: Path
    parent_dir: Path
    reference_dir: Path | None
    resume_optimizer: bool
    config: RunConfig
    samples: Sequence[TrainingSample]
    policy_version: int
    pad_token_id: int
    data_cursor: Mapping[str, Any]


@dataclass(frozen=True)
class RankOutcome:
    """The update's metrics (over the whole batch) and the checkpoint rank 0 saved."""

    metrics: UpdateMetrics
    checkpoint: CheckpointRef


def resolve_backend(config: UpdateConfig) -> str:
    """The torch.distributed backend a multi-rank update uses; refuses what cannot run."""
    backend = config.distributed_backend
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if gpus < config.world_size:
            raise UpdateError(
                f"update.world_size is {config.world_size} with the nccl backend, but this"
                f" worker has {gpus} CUDA device(s): nccl needs one per rank; lower"
                " update.world_size or set update.distributed_backend to gloo (CPU ranks)"
            )
    return backend


def run_ranks(job: RankJob) -> RankOutcome:
    """Run the update as ``job.config.update.world_size`` ranks; rank 0's checkpoint."""
    update = job.config.update
    backend = resolve_backend(update)
    job.artifact_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".ranks-", dir=job.artifact_dir))
    try:
        (work / JOB_FILE).write_text(json.dumps(_job_data(job, backend)))
        returncode = _launch(work, update.world_size, update.rank_timeout_s, backend)
        result = work / RESULT_FILE
        if returncode != 0 or not result.is_file():
            raise _failure(work, update.world_size, returncode)
        data = json.loads(result.read_text())
        metrics = dict(data["metrics"])
        metrics["off_policy"] = OffPolicyReport(**metrics["off_policy"])
        return RankOutcome(UpdateMetrics(**metrics),
                           CheckpointRef(data["checkpoint_id"], Path(data["path"])))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _job_data(job: RankJob, backend: str) -> dict[str, Any]:
    return {
        "backend": backend,
        "artifact_dir": str(job.artifact_dir),
        "parent_dir": str(job.parent_dir),
        "reference_dir": str(job.reference_dir) if job.reference_dir is not None else None,
        "resume_optimizer": job.resume_optimizer,
        "config": job.config.model_dump(mode="json"),
        "samples": [asdict(s) for s in job.samples],
        "policy_version": job.policy_version,
        "pad_token_id": job.pad_token_id,
        "data_cursor": dict(job.data_cursor),
    }


def _launch(work: Path, world_size: int, timeout_s: float, backend: str) -> int | None:
    """Run torchrun to completion; its exit code, or None when it ran out of time."""
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes=1",
        f"--nproc-per-node={world_size}", "--master-addr=127.0.0.1",
        f"--master-port={free_port()}", "--max-restarts=0", "--monitor-interval=0.5",
        "-m", RANK_MODULE, str(work),
    ]
    with (work / "torchrun.log").open("wb") as log:
        process = subprocess.Popen(command, cwd=work, env=_rank_env(world_size, backend),
                                   stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                   start_new_session=True)  # its own group: stoppable whole
        try:
            return process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _stop_group(process)
            return None
        except BaseException:
            _stop_group(process)
            raise


def _stop_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM torchrun's process group (it and its ranks), SIGKILL after a grace period."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=_STOP_GRACE_S)
            return
        except subprocess.TimeoutExpired:
            continue


def _rank_env(world_size: int, backend: str) -> dict[str, str]:
    env = dict(os.environ)
    # The ranks import this very code, whichever checkout the interpreter points at.
    root = str(Path(learning_loop.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    # Collective traffic stays on the loopback interface: nothing leaves the machine.
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env.setdefault("NCCL_SOCKET_IFNAME", "lo")
    if backend == "gloo":  # CPU ranks share the cores instead of each taking all of them
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // world_size)))
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def _failure(work: Path, world_size: int, returncode: int | None) -> RankFailed:
    """The clearest account of what went wrong: the first rank that raised, if one did."""
    errors = []
    for rank in range(world_size):
        path = work / f"rank-{rank}.error.json"
        if path.is_file():
            errors.append((json.loads(path.read_text()), rank))
    how = "ran out of update.rank_timeout_s" if returncode is None else f"exit {returncode}"
    if errors:
        error, first = min(errors, key=lambda item: float(item[0]["time"]))
        return RankFailed(
            f"rank {first} of {world_size} failed ({how}): {error['type']}: {error['message']}"
            f"\n--- rank {first} log (tail) ---\n{_tail(work / f'rank-{first}.log')}",
            rank=first, python_error=True)
    unfinished = [r for r in range(world_size) if not (work / f"rank-{r}.done").is_file()]
    stopped = unfinished[0] if unfinished else None
    where = f"rank {stopped} of {world_size}" if stopped is not None else "the update's ranks"
    log = work / f"rank-{stopped}.log" if stopped is not None else work / "torchrun.log"
    return RankFailed(
        f"{where} stopped without an error ({how}; unfinished ranks {unfinished})"
        f"\n--- {log.name} (tail) ---\n{_tail(log)}"
        f"\n--- torchrun.log (tail) ---\n{_tail(work / 'torchrun.log')}",
        rank=stopped, python_error=False)


def _tail(path: Path) -> str:
    try:
        text = path.read_bytes()[-_TAIL_CHARS:].decode(errors="replace")
    except OSError:
        return "(no log)"
    return text.strip() or "(empty)"
