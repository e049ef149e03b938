"""A decode step replayed from one CUDA graph: ``compile(model, cuda_graph=True)``.

At batch 1 a decode step is a few hundred small kernels, and launching them from Python costs
more than running them. The bounded cache makes the step capturable once and replayed for
every token: every cache tensor keeps its address (the step updates them in place), every
shape is fixed, every index is read on the device, and nothing synchronises with the host.
So one ``torch.cuda.CUDAGraph`` holds the whole compiled step; a replay costs one launch.

The graph is bound to the cache it was captured with (its tensors' addresses) and to the
batch size: a call with another cache or batch captures again. Warm-up runs before the
capture (compilation, library initialisation) work on the cache itself, whose tensors are
saved before and restored after, so the capture changes nothing the caller can see.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .kv_cache import KVpopCache

# Eager runs of the step before the capture: the first compiles; the second runs what was
# compiled, so that lazily initialised libraries (cuBLAS workspaces) exist before capturing.
WARMUP_STEPS = 2


class CUDAGraphStep:
    """``step(token (B, 1), position, cache) -> logits (B, vocab)`` replayed from a CUDA graph
    of ``step``, a decode function (eager or compiled) of a model on a CUDA device.

    ``position`` is not read: as in the compiled step, each row's position is what its row of
    the cache holds. The logits are returned as a new tensor each call (the graph's own output
    buffer is overwritten by the next replay).
    """

    def __init__(self, step: Callable, warmup: int = WARMUP_STEPS):
        self.step = step
        self.warmup = warmup
        self.graph: torch.cuda.CUDAGraph | None = None
        self.cache: KVpopCache | None = None
        self.token: torch.Tensor | None = None  # (B, 1) the graph's input buffer
        self.logits: torch.Tensor | None = None  # (B, vocab) the graph's output buffer

    def __call__(self, token: torch.Tensor, position, cache: KVpopCache) -> torch.Tensor:
        if token.device.type != "cuda":
            raise ValueError(
                f"a CUDA-graph decode step needs the model and tokens on a CUDA device, got "
                f"tokens on {token.device}; use compile(model) without cuda_graph elsewhere"
            )
        if self.graph is None or cache is not self.cache or token.shape != self.token.shape:
            self._capture(token, cache)
        self.token.copy_(token)
        self.graph.replay()
        return self.logits.clone()

    def _capture(self, token: torch.Tensor, cache: KVpopCache) -> None:
        states = [layer.state for layer in cache.layers]
        if any(state is None for state in states):
            raise ValueError(
                "the cache holds no tokens yet: prefill it (kc.prefill or kc.generate) before "
                "the first CUDA-graph decode step"
            )
        tensors = [t for state in states for t in state.tensors()]
        saved = [t.clone() for t in tensors]
        self.graph = None  # a failed capture leaves no graph bound to a stale cache
        self.token = token.clone()
        # Warm up on a side stream, as capture requires, then put the cache back as it was.
        side = torch.cuda.Stream(device=token.device)
        side.wait_stream(torch.cuda.current_stream(token.device))
        with torch.cuda.stream(side):
            for _ in range(self.warmup):
                self.step(self.token, None, cache)
        torch.cuda.current_stream(token.device).wait_stream(side)
        for tensor, original in zip(tensors, saved, strict=True):
            tensor.copy_(original)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.logits = self.step(self.token, None, cache)
        self.graph, self.cache = graph, cache
