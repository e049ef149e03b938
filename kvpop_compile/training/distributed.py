"""Data-parallel scorer training over ``torch.distributed`` (e.g. under ``torchrun``).

Every process holds the frozen model and all scorers; each takes an equal share of every batch
and gradients are averaged across processes before the optimizer step (the semantics of DDP,
whose module wrapper cannot be used here: scorers are called from inside the per-layer training
graphs, not through one wrapped forward). Equal shares of equal-length rows make the averaged
gradient the full batch's, so N processes reproduce one process to float rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class ProcessGroup:
    rank: int = 0
    world: int = 1

    @classmethod
    def current(cls) -> ProcessGroup:
        """The default process group if one is initialised, else a single process."""
        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size())
        return cls()

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def shard(self, rows: torch.Tensor) -> torch.Tensor:
        """This process's contiguous share of a batch's row indices."""
        share = len(rows) // self.world
        return rows[self.rank * share : (self.rank + 1) * share]

    def average_gradients(self, parameters) -> None:
        if self.world == 1:
            return
        for parameter in parameters:
            dist.all_reduce(parameter.grad)
            parameter.grad /= self.world

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        """The mean of ``value`` across processes."""
        if self.world == 1:
            return value
        total = value.detach().clone()
        dist.all_reduce(total)
        return total / self.world

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()
