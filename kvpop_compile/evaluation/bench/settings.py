"""What ``kvpop-compile bench`` measures and what it records: the methods, context lengths
(``8k`` = 8192 tokens), :class:`BenchSettings`, and the results, one :class:`Row` per context
and method in a :class:`BenchResult`."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from ...config import KVpopConfig, require_int

METHODS = {
    "dynamic": "dynamic cache",
    "static": "static cache + torch.compile",
    "eager": "KVpop eager",
    "compile": "KVpop kc.compile",
    "graph": "KVpop kc.compile + CUDA graph",
    "aoti": "KVpop AOTInductor",
}
DEFAULT_METHODS = ("dynamic", "static", "eager", "compile")
BASELINE = "dynamic"
TRANSFORMERS_METHODS = ("dynamic", "static")  # run before the model is transformed in place
K = 1024  # the "k" of "32k"


def parse_contexts(text: str) -> tuple[int, ...]:
    """Context lengths from ``"8k,32k"`` or ``"1000, 4096"``: ``k`` is 1024 tokens.

    Raises ``ValueError`` naming the bad item unless each is a whole number of tokens >= 1."""
    items = [item.strip() for item in str(text).split(",")]
    contexts = []
    for item in items:
        number, scale = (item[:-1], K) if item[-1:] in ("k", "K") else (item, 1)
        try:
            value = int(number) * scale
        except ValueError:
            value = None
        if value is None or value < 1:
            raise ValueError(
                f"context {item!r} is not a token count: give whole numbers >= 1, optionally "
                "with a k suffix (1k = 1024), separated by commas, e.g. 8k,32k"
            )
        contexts.append(value)
    return tuple(contexts)


def context_label(n: int) -> str:
    """``1024 -> '1k'``, ``32768 -> '32k'``; other sizes as they are."""
    return f"{n // K}k" if n >= K and n % K == 0 else str(n)


@dataclass(frozen=True)
class BenchSettings:
    """What to measure: ``contexts`` (prompt lengths; sorted, duplicates dropped), ``methods``
    (keys of :data:`METHODS`, run in that table's order), ``warmup`` untimed then
    ``decode_tokens`` timed decode steps, and the KVpop budget; ``batch`` sequences of one
    prompt length, each with its own cache."""

    contexts: tuple[int, ...]
    methods: tuple[str, ...] = DEFAULT_METHODS
    decode_tokens: int = 16
    warmup: int = 3
    kvpop_config: KVpopConfig = field(default_factory=KVpopConfig)
    seed: int = 0  # of the random prompt
    batch: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.contexts, (str, int)) or not self.contexts:
            raise ValueError(
                f"contexts must be a non-empty sequence of lengths, got {self.contexts!r}"
            )
        for n in self.contexts:
            require_int("each context", n, 1)
        methods = tuple(self.methods) if not isinstance(self.methods, str) else ()
        if not methods or any(m not in METHODS for m in methods):
            raise ValueError(
                f"methods must be a non-empty sequence of {', '.join(METHODS)}; got "
                f"{self.methods!r}"
            )
        require_int("decode_tokens", self.decode_tokens, 1)
        # The first step compiles: at least one untimed step keeps compilation out of the times.
        require_int("warmup", self.warmup, 1)
        require_int("seed", self.seed, 0)
        require_int("batch", self.batch, 1)
        if not isinstance(self.kvpop_config, KVpopConfig):
            raise TypeError(
                f"kvpop_config must be a KVpopConfig, got {type(self.kvpop_config).__name__}"
            )
        if self.kvpop_config.per_layer is not None:
            # The benchmark sizes its prompts and memory figures by one capacity.
            raise ValueError(
                f"the speed benchmark keeps one budget in every layer; kvpop_config keeps "
                f"{list(self.kvpop_config.capacities)} slots per KV head in its layers: give "
                "one window and one topk"
            )
        object.__setattr__(self, "contexts", tuple(sorted(set(self.contexts))))
        object.__setattr__(self, "methods", tuple(m for m in METHODS if m in methods))


@dataclass
class Row:
    """One method at one context: its figures, or the error that stopped it."""

    context: int
    method: str
    prefill_s: float | None = None
    step_s: list[float] = field(default_factory=list)  # seconds of each timed decode step
    peak_bytes: int | None = None  # above what was resident before the run; None: unmeasured
    kv_bytes: int | None = None  # the cache's bytes after the timed steps
    error: str | None = None
    batch: int = 1  # sequences per step

    @property
    def decode_tok_s(self) -> float | None:
        """Tokens per second over the batch: its size over the median timed step."""
        return self.batch / statistics.median(self.step_s) if self.step_s else None


@dataclass
class BenchResult:
    """A finished benchmark: what ran, where, and one :class:`Row` per context and method."""

    settings: BenchSettings
    model: str  # the checkpoint, or the shape the random weights were built for
    layers: int
    dtype: str
    device: str  # the GPU's or CPU's name
    weights_bytes: int
    rows: list[Row]
    notes: list[str] = field(default_factory=list)

    def row(self, context: int, method: str) -> Row | None:
        for row in self.rows:
            if row.context == context and row.method == method:
                return row
        return None

    def ratios(self, row: Row) -> dict[str, float | None]:
        """``row``'s prefill time, decode speed and peak memory over the dynamic cache's at the
        same context (decode > 1: faster; prefill and peak < 1: less); ``None`` where either
        figure is missing."""
        base = self.row(row.context, BASELINE)

        def ratio(mine, theirs):
            if base is None or mine is None or theirs is None or theirs == 0:
                return None
            return mine / theirs

        return {
            "prefill": ratio(row.prefill_s, base and base.prefill_s),
            "decode": ratio(row.decode_tok_s, base and base.decode_tok_s),
            "peak": ratio(row.peak_bytes, base and base.peak_bytes),
        }
