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
:class:`CapturedGraph` does the capture for any step that updates its state in place; an
exported AOTInductor engine's decode (``kc.load(folder, cuda_graph=True)``) uses it too.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .kv_cache import KVpopCache

# Eager runs of the step before the capture: the first compiles; the second runs what was
# compiled, so that lazily initialised libraries (cuBLAS workspaces) exist before capturing.
WARMUP_STEPS = 2


class CapturedGraph:
    """``call(token)`` captured in one CUDA graph: :meth:`replay` copies a token into the
    graph's input buffer, replays, and returns a copy of the output (the graph's own buffer is
    overwritten by the next replay).

    ``state`` are the tensors ``call`` updates in place (a cache): the warm-up calls before the
    capture (compilation, lazily initialised libraries) run on them, so they are saved before
    and restored after, and the capture changes nothing the caller can see.
    """

    def __init__(
        self,
        call: Callable[[torch.Tensor], torch.Tensor],
        token: torch.Tensor,
        state: list[torch.Tensor],
        warmup: int = WARMUP_STEPS,
    ):
        saved = [t.clone() for t in state]
        self.token = token.clone()  # (B, 1) the graph's input buffer
        device = token.device
        # Warm up on a side stream, as capture requires, then put the state back as it was.
        side = torch.cuda.Stream(device=device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(warmup):
                call(self.token)
        torch.cuda.current_stream(device).wait_stream(side)
        for tensor, original in zip(state, saved, strict=True):
            tensor.copy_(original)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.output = call(self.token)  # (B, vocab) the graph's output buffer

    def replay(self, token: torch.Tensor) -> torch.Tensor:
        self.token.copy_(token)
        self.graph.replay()
        return self.output.clone()


class CUDAGraphStep:
    """``step(token (B, 1), position, cache) -> logits (B, vocab)`` replayed from a CUDA graph
    of ``step``, a decode function (eager or compiled) of a model on a CUDA device.

    ``position`` is not read: as in the compiled step, each row's position is what its row of
    the cache holds. The logits are returned as a new tensor each call.
    """

    def __init__(self, step: Callable, warmup: int = WARMUP_STEPS):
        self.step = step
        self.warmup = warmup
        self.captured: CapturedGraph | None = None
        self.cache: KVpopCache | None = None

    def __call__(self, token: torch.Tensor, position, cache: KVpopCache) -> torch.Tensor:
        if token.device.type != "cuda":
            raise ValueError(
                f"a CUDA-graph decode step needs the model and tokens on a CUDA device, got "
                f"tokens on {token.device}; use compile(model) without cuda_graph elsewhere"
            )
        if (
            self.captured is None
            or cache is not self.cache
            or token.shape != self.captured.token.shape
        ):
            self._capture(token, cache)
        return self.captured.replay(token)

    def _capture(self, token: torch.Tensor, cache: KVpopCache) -> None:
        states = [layer.state for layer in cache.layers]
        if any(state is None for state in states):
            raise ValueError(
                "the cache holds no tokens yet: prefill it (kc.prefill or kc.generate) before "
                "the first CUDA-graph decode step"
            )
        self.captured = None  # a failed capture leaves no graph bound to a stale cache
        tensors = [t for state in states for t in state.tensors()]
        self.captured = CapturedGraph(
            lambda t: self.step(t, None, cache), token, tensors, self.warmup
        )
        self.cache = cache
