"""One rank of a multi-rank policy update; torchrun starts it (see ``rank_launch``).

``python -m learning_loop.rank_update WORK_DIR`` with torchrun's ``RANK``,
``WORLD_SIZE`` and ``LOCAL_RANK`` in the environment. The rank sends its stdout and
stderr (the C++ libraries' too) to ``WORK_DIR/rank-<rank>.log``, loads the parent
checkpoint exactly as the in-process update does, trains on its shard of each
mini-batch with the gradients summed across ranks, and rank 0 saves the checkpoint and
``result.json`` (written beside and renamed, so the launcher never reads half a file).
A rank that raises records the error in ``rank-<rank>.error.json`` and exits 1;
``rank-<rank>.done`` marks a rank that finished.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from learning_loop.batch import TrainingSample
from learning_loop.data_parallel import RankGroup
from learning_loop.iteration import load_learner, load_model, save_servable
from learning_loop.rank_launch import JOB_FILE, RESULT_FILE
from learning_loop.update import UpdateSettings, update_policy
from learning_loop.update_options import apply_update_options
from triloop.run_config import RunConfig


def main(argv: list[str]) -> int:
    """Run this rank; 0 when it finished, 1 when it raised (recorded for the launcher)."""
    work = Path(argv[0])
    rank = int(os.environ["RANK"])
    with (work / f"rank-{rank}.log").open("ab") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    try:
        run_rank(work, rank, int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"]))
    except BaseException as exc:  # the launcher reports it with this rank's number
        if not _error_file(work, rank).is_file():
            _record_error(work, rank, exc)
        return 1
    (work / f"rank-{rank}.done").touch()
    return 0


def run_rank(work: Path, rank: int, world_size: int, local_rank: int) -> None:
    """Join the process group, update on this rank's shards, rank 0 saves."""
    job = json.loads((work / JOB_FILE).read_text())
    config = RunConfig.model_validate(job["config"])
    backend = str(job["backend"])
    device = torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, timeout=timedelta(seconds=config.update.rank_timeout_s),
                            device_id=device if device.type == "cuda" else None)
    try:
        parent = Path(job["parent_dir"])
        model, optimizer, scheduler = load_learner(
            parent, config, device, resume_optimizer=bool(job["resume_optimizer"]))
        reference = None
        if job["reference_dir"] is not None:
            reference = load_model(Path(job["reference_dir"]), device)
            reference.train(False)
        apply_update_options(config.update, device, model, reference)
        metrics = update_policy(
            model, optimizer, [sample_from_json(s) for s in job["samples"]],
            UpdateSettings.from_run(config), policy_version=int(job["policy_version"]),
            reference=reference, scheduler=scheduler, device=device,
            pad_token_id=int(job["pad_token_id"]),
            ranks=RankGroup(rank, world_size, device),
        )
        if rank == 0:  # the ranks hold identical weights: one of them saves, once
            saved = save_servable(Path(job["artifact_dir"]), model, parent,
                                  optimizer=optimizer, scheduler=scheduler,
                                  data_cursor=job["data_cursor"], metadata={})
            _write_atomically(work / RESULT_FILE, json.dumps({
                "metrics": asdict(metrics), "checkpoint_id": saved.id,
                "path": str(saved.path)}))
        dist.barrier()
    except BaseException as exc:
        # Recorded before the group goes down: the peers fail only after this, so the
        # launcher can tell the rank that failed first from those it took down.
        _record_error(work, rank, exc)
        raise
    finally:
        dist.destroy_process_group()


def _error_file(work: Path, rank: int) -> Path:
    return work / f"rank-{rank}.error.json"


def _record_error(work: Path, rank: int, exc: BaseException) -> None:
    traceback.print_exception(exc)
    sys.stderr.flush()
    _write_atomically(_error_file(work, rank), json.dumps({
        "type": type(exc).__name__, "message": str(exc)[:2000], "time": time.time()}))


def sample_from_json(data: dict[str, Any]) -> TrainingSample:
    """A training sample from ``dataclasses.asdict`` output read back from JSON."""
    return TrainingSample(**{k: _tuples(v) for k, v in data.items()})


def _tuples(value: Any) -> Any:
    """JSON gives lists where the sample holds tuples (nested ones too)."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _write_atomically(path: Path, text: str) -> None:
    staging = path.with_name(f".{path.name}.tmp")
    staging.write_text(text)
    os.replace(staging, path)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
