"""The bounded KV cache state of one layer: fixed-shape tensors, updated in place (floor 5 of
the runtime, with the bounded attention that reads and writes it).

Nothing here has a shape that depends on how many tokens have been seen, so a decode step is
one static graph (CUDA graphs, ``torch.compile(fullgraph=True)``, export). The state is a plain
set of tensors that can travel as explicit inputs and outputs of an exported graph
(:meth:`BoundedCacheState.tensors`): exporters such as ONNX drop state kept as mutated buffers.

Slot layout along the ``C = sinks + topk + window`` axis::

    [0, S)          sinks: position p < S lives in slot p
    [S, S + K)      pool: the kept older tokens, in no particular order
    [S + K, C)      window ring: position p >= S lives in slot S + K + (p - S) % W
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from ..config import KVpopConfig
from .scorers.base import Scorer

# What an empty cache holds, per field (0 for fields not listed): a runtime that allocates the
# state itself, such as an exported engine's runner, fills it from this table.
EMPTY_FILL = {"positions": -1, "priorities": float("-inf"), "recent_scores": float("-inf")}


@dataclass
class BoundedCacheState:
    """One layer's cache. ``B`` batch, ``H`` KV heads, ``D`` head dim, ``C`` capacity."""

    keys: torch.Tensor  # (B, H, C, D) keys after RoPE
    values: torch.Tensor  # (B, H, C, D)
    positions: torch.Tensor  # (B, H, C) int64 token position per slot, -1 = empty
    priorities: torch.Tensor  # (B, H, K) float32 pool priorities, -inf = empty
    window_keys: torch.Tensor  # (B, H, W, D) pre-RoPE keys of the window ring (scorer input)
    statistic: (
        torch.Tensor
    )  # (B, H, C) float32 attention received (attention-fed scorers) or (B, H, 0)
    scorer_state: torch.Tensor  # (B, H, *scorer.state_shape) float32 recurrent scorer state
    # (B, H, P) float32 scores of the last P = priority_span tokens that left the window, oldest
    # first, -inf = none: what the next leaving token's score spreads from (P = 0: off).
    recent_scores: torch.Tensor
    # (B,) int64 tokens each row has written = the position of its next token. Per row, so a
    # batch of prompts of different lengths (left-padded, the padding never written) is held.
    seen: torch.Tensor

    @classmethod
    def empty(
        cls,
        config: KVpopConfig,
        scorer: Scorer,
        *,
        batch: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> BoundedCacheState:
        """An empty cache for ``scorer.num_kv_heads`` heads."""
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        heads, capacity = scorer.num_kv_heads, config.capacity
        stat_slots = capacity if scorer.attention_fed else 0
        state = cls(
            keys=torch.zeros(batch, heads, capacity, head_dim, dtype=dtype, device=device),
            values=torch.zeros(batch, heads, capacity, head_dim, dtype=dtype, device=device),
            positions=torch.empty(batch, heads, capacity, dtype=torch.int64, device=device),
            priorities=torch.empty(batch, heads, config.topk, device=device),
            window_keys=torch.zeros(
                batch, heads, config.window, head_dim, dtype=dtype, device=device
            ),
            statistic=torch.zeros(batch, heads, stat_slots, device=device),
            scorer_state=scorer.init_state(batch, device),
            recent_scores=torch.empty(batch, heads, config.priority_span, device=device),
            seen=torch.zeros(batch, dtype=torch.int64, device=device),
        )
        state.reset_()
        return state

    def reset_(self) -> BoundedCacheState:
        """Empty the cache in place (tensor addresses are kept, for CUDA graphs)."""
        for f in fields(self):
            getattr(self, f.name).fill_(EMPTY_FILL.get(f.name, 0))
        return self

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """All state tensors, in field order (for exporting the cache as explicit I/O)."""
        return tuple(getattr(self, f.name) for f in fields(self))

    @property
    def nbytes(self) -> int:
        """Bytes held by the cache, scorer state included. Independent of tokens seen."""
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def cached_positions(self) -> list[list[list[int]]]:
        """Sorted token positions held per (batch, head), for inspection and tests."""
        return [
            [sorted(p for p in row.tolist() if p >= 0) for row in per_batch]
            for per_batch in self.positions
        ]
