"""Data-parallel training over ``torch.distributed`` (e.g. under ``torchrun``).

Every process takes an equal share of every batch. Scorers are replicated: their gradients are
averaged across processes before the optimizer step (the semantics of DDP, whose module wrapper
cannot be used here: scorers are called from inside the per-layer training graphs, not through
one wrapped forward). In distillation the fine-tuned student is sharded with FSDP2
(:func:`shard_student`): each process keeps a slice of its parameters, gradients and optimizer
state. Equal shares of equal-length rows make the averaged gradient the full batch's, so N
processes reproduce one process to float rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn


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

    def from_main(self, value):
        """The main process's ``value`` (any picklable object), on every process."""
        if self.world == 1:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]


def shard_student(model: nn.Module, group: ProcessGroup, keep_whole: set[nn.Parameter]) -> None:
    """FSDP2 over ``group``: every decoder layer, then the rest of ``model``, sharded in place.

    ``keep_whole`` (the scorers, which the teacher's graphs share) stay ordinary replicated
    tensors. The training graphs read parameters through the layers' own submodules, so they
    see the whole parameters FSDP2 gathers for each layer's forward.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    device = next(model.parameters()).device.type
    mesh = init_device_mesh(device, (group.world,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, ignored_params=keep_whole)
    fully_shard(model, mesh=mesh, ignored_params=keep_whole)


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """The full value of a possibly sharded (DTensor) tensor; a collective when sharded."""
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def assign_whole(parameter: torch.Tensor, value: torch.Tensor) -> None:
    """Copy a full ``value`` into a possibly sharded parameter (each process keeps its slice)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if isinstance(parameter, DTensor):
        value = distribute_tensor(value.to(parameter.dtype), parameter.device_mesh,
                                  parameter.placements)  # fmt: skip
    parameter.copy_(value)
