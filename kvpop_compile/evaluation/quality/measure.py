"""``kvpop-compile eval``: run every method over the held-out sequences and keep per-sequence sums.

For each method (:mod:`kvpop_compile.evaluation.methods`) and each sequence this records, as
sums so that any subset of sequences can be pooled (and bootstrapped) exactly:

- ``teacher_forced``: correct predictions, NLL and their count over all targets, and the same
  over the long-range targets (:mod:`.long_range`; byte tokens only);
- ``continuation``: greedy tokens after the prompt that equal full attention's, and where the
  first difference falls (the continuation's length if none);
- ``compression``: the prompt-compression protocol's correct/NLL sums, all and long-range.

Long-range targets are identifiers found in bytes: sequences of a tokenizer's ids (not
``byte_tokens``) have none, and their records carry no ``lr_*`` sums.
"""

from __future__ import annotations

import platform
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from torch import nn
from tqdm.auto import tqdm

from ..._version import __version__
from ...config import require_int
from ..data import PROMPT_LENGTH, Sequence
from ..methods import WINDOW, Method, build_model, check_scorers
from ..protocols import (
    Scores,
    compressed_prompt,
    first_difference,
    greedy_continuation,
    teacher_forced,
)
from .long_range import long_range_targets

PROTOCOLS = ("teacher_forced", "continuation", "compression")
MEMORY_EVERY = 64  # record the cache's bytes every this many generated tokens


@dataclass
class EvalSettings:
    batch: int = 16  # sequences per forward
    protocols: tuple[str, ...] = PROTOCOLS
    prompt_length: int = PROMPT_LENGTH
    threads: int | None = None

    def __post_init__(self) -> None:
        require_int("batch", self.batch, 1)
        require_int("prompt_length", self.prompt_length, 1)
        if self.threads is not None:
            require_int("threads (or None)", self.threads, 1)
        unknown = [p for p in self.protocols if p not in PROTOCOLS]
        if isinstance(self.protocols, str) or unknown or not self.protocols:
            raise ValueError(
                f"protocols must be a non-empty sequence of {', '.join(PROTOCOLS)}; got "
                f"{self.protocols!r}"
            )


def _sums(scores: Scores, long_range: torch.Tensor | None) -> dict[str, list[float]]:
    """Per-sequence sums over all targets and over the long-range ones ((B, T) mask, or None
    where they are not known)."""
    correct, nll = scores.correct.double(), scores.nll.double()
    sums = {
        "correct": correct.sum(1).tolist(),
        "nll": nll.sum(1).tolist(),
        "count": [float(correct.shape[1])] * correct.shape[0],
    }
    if long_range is not None:
        lr = long_range.double()
        sums["lr_correct"] = (correct * lr).sum(1).tolist()
        sums["lr_nll"] = (nll * lr).sum(1).tolist()
        sums["lr_count"] = lr.sum(1).tolist()
    return sums


def _extend(into: dict, part: dict) -> None:
    for key, values in part.items():
        into.setdefault(key, []).extend(values)


def versions() -> dict[str, str]:
    """The versions a run's results depend on, for its report."""
    return {
        "kvpop_compile": __version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }


def run_eval(
    original: nn.Module,
    sequences: list[Sequence],
    methods: list[Method],
    *,
    settings: EvalSettings | None = None,
    scorer_root: str | Path | None = None,
    progress: bool = True,
) -> dict:
    """Run ``methods`` (the first must be full attention) over ``sequences``; a JSON-ready dict.

    Every sequence holds ``length + 1`` tokens, and ``length`` must be within the model's
    ``max_position_embeddings``; a learned method's missing scorer is refused before anything
    runs.
    """
    settings = settings or EvalSettings()
    unknown = set(settings.protocols) - set(PROTOCOLS)
    if unknown:
        raise ValueError(f"protocols must be among {', '.join(PROTOCOLS)}; got {sorted(unknown)}")
    if not methods or methods[0].policy is not None:
        raise ValueError("the first method must be full attention (the reference)")
    if not sequences:
        raise ValueError("no sequences to evaluate")
    lengths = {s.ids.numel() for s in sequences}
    if len(lengths) != 1:
        raise ValueError(f"sequences must have one length, got {sorted(lengths)}")
    length = lengths.pop() - 1
    positions = original.config.max_position_embeddings
    if length > positions:
        raise ValueError(
            f"sequences of {length} tokens exceed the model's max_position_embeddings "
            f"{positions}; use a length of at most {positions}"
        )
    if not 0 < settings.prompt_length < length - 1:
        raise ValueError(f"prompt_length must be in 1..{length - 2}, got {settings.prompt_length}")
    check_scorers(methods, scorer_root)
    if settings.threads:
        torch.set_num_threads(settings.threads)
    ids = torch.stack([s.ids for s in sequences])  # (S, L + 1)
    long_range = None  # (S, L) targets that recall an identifier, where ids are bytes
    if all(s.byte_tokens for s in sequences):
        long_range = torch.stack([long_range_targets(s.ids, WINDOW) for s in sequences])[:, 1:]
    batches = [slice(i, i + settings.batch) for i in range(0, len(sequences), settings.batch)]
    steps = length - settings.prompt_length
    # The last token is generated without a forward after it: the last size is at length - 1.
    record_at = set(range(settings.prompt_length + MEMORY_EVERY, length, MEMORY_EVERY))
    record_at.add(length - 1)
    work = len(methods) * len(batches) * len(settings.protocols)
    bar = tqdm(total=work, disable=not progress, desc="kvpop-compile eval", unit="run")
    results, reference = {}, None
    started = time.perf_counter()
    for method in methods:
        bar.set_postfix_str(method.name)
        model = build_model(original, method, scorer_root)
        record = method.record()
        for protocol in settings.protocols:
            sums: dict = {}
            generated = []
            memory: dict[int, int] = {}
            for rows in batches:
                if protocol == "teacher_forced":
                    lr = None if long_range is None else long_range[rows]
                    _extend(sums, _sums(teacher_forced(model, ids[rows]), lr))
                elif protocol == "compression":
                    scores = compressed_prompt(original, model, ids[rows], settings.prompt_length)
                    lr = None if long_range is None else long_range[rows, settings.prompt_length :]
                    _extend(sums, _sums(scores, lr))
                else:
                    run = greedy_continuation(
                        model, ids[rows, : settings.prompt_length], steps, record_at=record_at
                    )
                    generated.append(run.tokens)
                    if not memory:  # bytes per sequence, from the first batch
                        rows_in_batch = run.tokens.shape[0]
                        memory = {n: b // rows_in_batch for n, b in run.cache_bytes.items()}
                bar.update()
            if protocol == "continuation":
                tokens = torch.cat(generated)
                if method.policy is None:
                    reference = tokens
                sums = {
                    "agree": (tokens == reference).double().sum(1).tolist(),
                    "count": [float(steps)] * tokens.shape[0],
                    "first_difference": first_difference(tokens, reference).double().tolist(),
                    "cache_bytes": {str(n): b for n, b in sorted(memory.items())},
                }
            record[protocol] = sums
        results[method.name] = record
    bar.close()
    return {
        "sequences": [s.source for s in sequences],
        "length": length,
        "prompt_length": settings.prompt_length,
        "long_range_window": WINDOW,
        "protocols": list(settings.protocols),
        "methods": results,
        "seconds": time.perf_counter() - started,
        "versions": versions(),
    }
