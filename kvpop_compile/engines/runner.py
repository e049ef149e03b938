"""``EngineRunner``: generate from an exported engine, keeping the bounded cache between steps."""

from __future__ import annotations

from pathlib import Path

import torch

from ..cuda_graph import CapturedGraph
from .manifest import DTYPES
from .steps import empty_fill, row_major


class EngineRunner:
    """Runs an engine folder's ``decode`` (and optional ``prefill``) steps.

    The cache is allocated empty here, at load time, from the manifest's state description; each
    step takes it as input and returns it updated. With ``cuda_graph`` (an AOTInductor engine on
    a CUDA device) the decode step is captured in one CUDA graph at its first call and replayed
    for every token after: the cache's tensors never move, so one capture serves every step.

    Every input reaches the engine in row-major strides, as it was exported (a compiled step
    reads its inputs with the strides it was traced at): token ids of any layout are copied into
    them. Token ids outside ``[0, vocab_size)`` are refused before they reach the engine (an
    embedding lookup would read out of bounds, or wrap a negative id): :meth:`prefill` and
    :meth:`decode` check the ids they are given on the host, one small reduction per call; the
    decode steps of :meth:`generate` feed back the argmax of the engine's own logits, in range
    by construction, and skip the check, so generating never waits on the device.
    """

    def __init__(
        self,
        folder: Path,
        manifest: dict,
        steps: dict,
        device: str = "cpu",
        *,
        cuda_graph: bool = False,
    ):
        self.folder = Path(folder)
        self.manifest = manifest
        self.steps = steps
        self.device = torch.device(device)
        self.batch = manifest["batch"]
        self.prefill_length = manifest["prefill_length"]
        self.vocab_size = manifest["model"]["vocab_size"]
        if not isinstance(cuda_graph, bool):
            raise TypeError(f"cuda_graph must be True or False, got {cuda_graph!r}")
        if cuda_graph and (self.device.type != "cuda" or manifest.get("format") != "aoti"):
            raise ValueError(
                "cuda_graph=True needs an AOTInductor engine exported on a CUDA device; this "
                f"one is {manifest.get('format')!r} on {self.device.type}: load it without "
                "cuda_graph"
            )
        self.cuda_graph = cuda_graph
        self.captured: CapturedGraph | None = None
        self.state = [
            torch.empty(spec["shape"], dtype=DTYPES[spec["dtype"]], device=self.device)
            for spec in manifest["state"]
        ]
        self.reset()

    def reset(self) -> None:
        """Empty the cache: the next call starts a new sequence."""
        for tensor, spec in zip(self.state, self.manifest["state"], strict=True):
            tensor.fill_(empty_fill(spec["name"]))

    def _run(self, name: str, tokens: torch.Tensor) -> torch.Tensor:
        outputs = self.steps[name]([row_major(tokens.to(self.device)), *self.state])
        logits, state = outputs[0], outputs[1:]
        for tensor, new in zip(self.state, state, strict=True):
            if new.data_ptr() != tensor.data_ptr():
                tensor.copy_(new)
        return logits

    def _check(self, tokens: torch.Tensor) -> torch.Tensor:
        """Integer ``(batch, N)`` ids in ``[0, vocab_size)`` as the engine's int64, refused
        before any engine call: a wrong shape would fail deep inside the runtime, float ids
        would be truncated, and an id out of range would index past the embedding table."""
        if not isinstance(tokens, torch.Tensor):
            raise TypeError(f"token ids must be a torch.Tensor, got {type(tokens).__name__}")
        if tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
            raise ValueError(
                f"token ids must be integers, got {tokens.dtype}; pass ids of shape "
                f"({self.batch}, N) with an integer dtype"
            )
        if tokens.dim() != 2 or tokens.shape[0] != self.batch:
            raise ValueError(
                f"expected token ids of shape ({self.batch}, N) for this engine (exported for "
                f"batch {self.batch}), got {tuple(tokens.shape)}"
            )
        outside = (tokens < 0) | (tokens >= self.vocab_size)
        if bool(outside.any()):
            raise ValueError(
                f"token id {int(tokens[outside][0])} is outside this engine's vocabulary: ids "
                f"must be in [0, {self.vocab_size})"
            )
        return tokens.to(torch.int64)

    def decode(self, token: torch.Tensor) -> torch.Tensor:
        """One token per sequence ``(B, 1)`` → next-token logits ``(B, vocab)``."""
        token = self._check(token)
        if token.shape[1] != 1:
            raise ValueError(f"decode takes one token per sequence, got {token.shape[1]}")
        return self._decode(token)

    def _decode(self, token: torch.Tensor) -> torch.Tensor:
        """:meth:`decode` of checked ids ``(B, 1)``."""
        if not self.cuda_graph:
            return self._run("decode", token)
        token = row_major(token.to(self.device))  # a CUDA device: the constructor checked
        if self.captured is None:
            self.captured = CapturedGraph(lambda t: self._run("decode", t), token, self.state)
        return self.captured.replay(token)

    def prefill(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Start a new sequence with the prompt ``(B, N)`` → next-token logits ``(B, vocab)``.

        The prompt runs in chunks of the engine's ``prefill_length`` through its prefill step
        (each chunk continues the cache exactly), and what is left over, or the whole prompt
        for an engine without one, through decode steps: the same result either way.

        ``attention_mask (B, N)`` (1: token, 0: padding) takes left-padded prompts of different
        lengths. The columns where some row is still padding run through decode steps whose
        padded rows' cache is put back afterwards, so padding never enters a cache; the rest
        runs as above, each row continuing from its own length."""
        input_ids = self._check(input_ids)
        if input_ids.shape[1] < 1:
            raise ValueError("prefill needs at least one token")
        self.reset()
        padded = self._padded_columns(input_ids, attention_mask)
        for i in range(padded.shape[1]):
            logits = self._decode_rows(input_ids[:, i : i + 1], active=~padded[:, i])
        begin = whole = padded.shape[1]  # from here on, every row has tokens
        if self.prefill_length:
            whole += (input_ids.shape[1] - begin) // self.prefill_length * self.prefill_length
            for start in range(begin, whole, self.prefill_length):
                logits = self._run("prefill", input_ids[:, start : start + self.prefill_length])
        for i in range(whole, input_ids.shape[1]):
            logits = self._decode(input_ids[:, i : i + 1])
        return logits

    def _padded_columns(self, input_ids: torch.Tensor, attention_mask) -> torch.Tensor:
        """``(B, P)`` bool: which of the first ``P`` columns are padding, ``P`` the last column
        any row pads (``P = 0`` without padding). Refuses a mask that is not left padding."""
        if attention_mask is None:
            return torch.zeros(self.batch, 0, dtype=torch.bool)
        if not isinstance(attention_mask, torch.Tensor) or attention_mask.shape != input_ids.shape:
            got = tuple(attention_mask.shape) if isinstance(attention_mask, torch.Tensor) else (
                type(attention_mask).__name__)  # fmt: skip
            raise ValueError(
                f"attention_mask must have the ids' shape {tuple(input_ids.shape)}, got {got}"
            )
        tokens = attention_mask.cpu() != 0
        if bool((tokens[:, 1:] < tokens[:, :-1]).any()):
            raise ValueError(
                "attention_mask has padding after a token: pass left-padded prompts "
                "(tokenizer padding_side='left')"
            )
        if not bool(tokens[:, 0].any()):
            raise ValueError(
                "attention_mask pads every row at its first column: drop the columns that are "
                "padding in every row"
            )
        return ~tokens[:, : int((~tokens).sum(dim=1).max())]

    def _decode_rows(self, token: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        """A decode step that changes the cache of the ``active (B,)`` rows only."""
        if bool(active.all()):
            return self._decode(token)
        before = [tensor.clone() for tensor in self.state]
        logits = self._decode(token)
        active = active.to(self.device)
        for tensor, old in zip(self.state, before, strict=True):
            keep = active.view(-1, *([1] * (tensor.dim() - 1)))
            tensor.copy_(torch.where(keep, tensor, old))
        return logits

    @torch.no_grad()
    def generate(
        self,
        input_ids: torch.Tensor,
        max_new_tokens: int,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Greedy generation: ``(B, N)`` → ``(B, N + max_new_tokens)``; ``attention_mask`` as
        in :meth:`prefill`."""
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        token = self.prefill(input_ids, attention_mask).argmax(dim=-1, keepdim=True)
        tokens = [input_ids.to(token.device), token]
        for _ in range(max_new_tokens - 1):
            token = self._decode(token).argmax(dim=-1, keepdim=True)
            tokens.append(token)
        return torch.cat([t.cpu() for t in tokens], dim=1)
