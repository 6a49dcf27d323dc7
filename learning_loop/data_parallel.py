"""Data parallelism inside one policy update: which samples a rank trains on, and the sums.

Every rank holds the same model and optimizer state and sees the whole batch; for each
mini-batch it trains on its shard (micro-batched as usual), with the loss normalised by
the mini-batch's total so that the shards' gradients add up to the mini-batch's
gradient. ``sum_gradients`` then all-reduces the accumulated gradients (one flat buffer,
one collective) so every rank clips and steps on the same gradient as one process
would: the same update, up to float rounding in the order of the sums.

Why not the ``DistributedDataParallel`` wrapper: it all-reduces inside each backward and
averages over ranks. Gradient accumulation then needs ``no_sync`` on every micro-batch
but a rank's last, and the shards of a mini-batch need not have the same number of
micro-batches, so the ranks would issue their collectives at different points (a hang,
or the ``Join`` machinery to shadow them). Accumulating locally and reducing once per
optimizer step is what DDP with ``no_sync`` amounts to, without that coupling; on one
machine the lost overlap of communication with the backward is small next to a step.
Parameters that no rank touched keep no gradient, as in one process (AdamW skips them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import torch
import torch.distributed as dist

from learning_loop.batch import TrainingSample
from learning_loop.objective import ObjectiveStats


@dataclass(frozen=True)
class RankGroup:
    """This process's place in an initialised ``torch.distributed`` process group."""

    rank: int
    world_size: int
    # Device of the collectives' buffers: CUDA for nccl, CPU for gloo.
    device: torch.device = torch.device("cpu")

    def shard(self, samples: Sequence[TrainingSample]) -> list[TrainingSample]:
        """This rank's trajectories (each whole, so it keeps its one packed forward pass):
        longest first, dealt round-robin so tokens balance."""
        trajectories: dict[str, list[TrainingSample]] = {}
        for sample in samples:
            trajectories.setdefault(sample.trajectory_id, []).append(sample)
        units = list(trajectories.values())
        order = sorted(range(len(units)),
                       key=lambda i: (-sum(s.length for s in units[i]), i))
        return [s for i in order[self.rank :: self.world_size] for s in units[i]]

    def sum_gradients(self, model: torch.nn.Module) -> None:
        """All-reduce (sum) the trainable parameters' gradients across ranks, in place."""
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            return
        # One buffer: every gradient (zeros where this rank has none) plus one "has a
        # gradient" flag per parameter, so a parameter only some ranks reached still gets
        # the sum, and one that no rank reached stays without a gradient.
        pieces = [p.grad.detach().reshape(-1).float() if p.grad is not None
                  else torch.zeros(p.numel(), device=self.device) for p in params]
        flags = torch.tensor([float(p.grad is not None) for p in params], device=self.device)
        flat = torch.cat([*(x.to(self.device) for x in pieces), flags])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for p in params:
            n = p.numel()
            summed = flat[offset : offset + n]
            offset += n
            p.grad = summed.view_as(p).to(device=p.device, dtype=p.dtype).clone()
        for p, present in zip(params, flat[offset:].tolist(), strict=True):
            if present == 0.0:
                p.grad = None

    def sum_stats(self, stats: ObjectiveStats, loss: float, *, with_reference: bool
                  ) -> tuple[ObjectiveStats, float]:
        """The objective statistics and loss of the whole mini-batch (sums over ranks)."""
        names = [f.name for f in fields(ObjectiveStats)]
        values = [float(getattr(stats, name) or 0.0) for name in names]
        totals = torch.tensor([*values, loss], dtype=torch.float64, device=self.device)
        dist.all_reduce(totals, op=dist.ReduceOp.SUM)
        summed = dict(zip(names, totals[:-1].tolist(), strict=True))
        if not with_reference:
            summed["reference_kl_sum"] = None
        return replace(stats, **summed), float(totals[-1])
