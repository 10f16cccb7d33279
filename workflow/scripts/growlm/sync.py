"""The training losses between two sync points: kept on the device, read on the host in one transfer.

`growlm.train`'s loop reads its losses only where it needs a value or one decision of all ranks (its
sync points, `TrainConfig.sync_interval`); `PendingLosses` holds the steps in between.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


class PendingLosses:
    """The training losses of the steps since the last sync point, still on the device.

    Reading a loss on the host (`.item()`) waits until the device has finished every step queued so
    far; done at every step, it empties a GPU's launch queue once a step and the next step's kernels
    start only after the host has caught up (the launch-bound steps of small models). The loop keeps
    each step's micro-batch losses as device tensors and reads them all with one transfer at a sync
    point. The values, their order and the arithmetic on them (the step's sum of micro-batch losses,
    the ranks' mean, the running average) are those of a read at every step, so the ledger and the
    checkpoints do not depend on the interval; only how many steps later a NaN loss stops the run
    (it names the step it appeared at, and no checkpoint is written between) and how late a stop
    request reaches the other ranks.
    """

    def __init__(self):
        self.steps: list[tuple[int, list[torch.Tensor]]] = []

    def add(self, step: int, losses: list[torch.Tensor]) -> None:
        self.steps.append((step, losses))

    def read(self, stop_requested: bool, world: int, device: str) -> tuple[list[tuple[int, float]], bool]:
        """[(step, loss)] of the pending steps and whether any rank asked to stop; clears them."""
        flat = torch.stack([loss.float() for _, losses in self.steps for loss in losses]).tolist()
        sums, k = [], 0
        for _, losses in self.steps:  # a plain running sum, as one read per micro-batch adds them (not sum():
            total = 0.0               # it compensates rounding from Python 3.12 on, which would change the bits)
            for v in flat[k:k + len(losses)]:
                total += v
            sums.append(total)
            k += len(losses)
        stopping = stop_requested
        if world > 1:  # the ranks' mean loss, and one decision on a stop request for all of them
            t = torch.tensor([*sums, float(stop_requested)], device=device)
            dist.all_reduce(t)
            reduced = t.tolist()
            sums, stopping = [v / world for v in reduced[:-1]], reduced[-1] > 0
        values = [(step, v) for (step, _), v in zip(self.steps, sums)]
        self.steps = []
        return values, stopping
