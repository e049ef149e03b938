"""KVpop configuration: the cache budget and the scorer that decides what stays in it."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from enum import Enum


class ScorerKind(str, Enum):
    """Which policy scores the tokens that leave the window (design.md §3)."""

    MEMORY = "memory"  # learned, delayed, stateful (the default)
    MLP = "mlp"  # learned, stateless
    WINDOW = "window"  # StreamingLLM: sinks + the most recent tokens
    RANDOM = "random"  # seeded random keep-or-drop
    KNORM = "knorm"  # keep keys of small norm
    H2O = "h2o"  # cumulative attention received (attention-fed)
    TOVA = "tova"  # last query's attention (attention-fed)

    @property
    def attention_fed(self) -> bool:
        """Whether scores change every step with the attention the cache receives."""
        return self in (ScorerKind.H2O, ScorerKind.TOVA)

    @property
    def learned(self) -> bool:
        return self in (ScorerKind.MEMORY, ScorerKind.MLP)


def require_int(name: str, value: object, minimum: int) -> None:
    """Raise ``ValueError`` naming ``value`` unless it is an integer ``>= minimum``. A bool is
    not an integer here: ``window=True`` is a mistake, not a window of 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def require_choice(name: str, value: object, kind: type[Enum]) -> Enum:
    """``kind(value)``, or a ``ValueError`` naming ``value`` and the allowed choices."""
    try:
        return kind(value)
    except ValueError:
        allowed = ", ".join(member.value for member in kind)
        raise ValueError(f"{name} must be one of {allowed}; got {value!r}") from None


def require_number(name: str, value: object, *, positive: bool) -> None:
    """Raise ``ValueError`` naming ``value`` unless it is a finite real number, ``> 0`` if
    ``positive`` else ``>= 0`` (a bool is not a number here)."""
    bound = "> 0" if positive else ">= 0"
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise ValueError(f"{name} must be a finite number {bound}, got {value!r}")


@dataclass(frozen=True)
class KVpopConfig:
    """The per-layer, per-KV-head cache budget and the policy that fills it.

    Capacity is ``sinks + window + topk`` slots: the first ``sinks`` positions, the ``window``
    most recent tokens (the current one included) and a pool of the ``topk`` older tokens of
    highest priority ``rhat_t + lam * t``. With ``priority_span = P > 0`` a token's ``rhat_t`` is
    first raised to the highest score among itself and the ``P`` tokens that left the window
    just before it, so a token right after one the scorer rates highly (the other bytes of a
    number, the rest of a name) is kept with it.
    """

    sinks: int = 4
    window: int = 256
    topk: int = 3836
    lam: float = 0.0
    scorer: ScorerKind | str = ScorerKind.MEMORY
    # Scores spread to the P tokens after each (0: off), for scorers whose scores are fixed
    # when a token leaves the window. The scorer's loss still scores each token on its own;
    # the distillation student's mask includes the spread, as inference does.
    priority_span: int = 0
    scorer_hidden: int = 64  # hidden width of the scorers' readout MLP
    memory_dim: int = 32  # key/query feature size of the memory scorer
    memory_value_dim: int = 32  # value feature size of the memory scorer
    seed: int = 0  # seed of the `random` scorer and of scorer initialisation
    prefill_block: int = 128  # query rows per block in prefill attention: O(block * N) memory
    # Tokens per chunk when a prompt enters the cache (None: the capacity). A chunk holds the
    # cache plus itself in memory, so peak memory does not grow with the prompt's length.
    prefill_chunk: int | None = None

    def __post_init__(self) -> None:
        require_int("sinks", self.sinks, 0)
        require_int("window", self.window, 1)
        require_int("topk", self.topk, 0)
        require_int("scorer_hidden", self.scorer_hidden, 1)
        require_int("memory_dim", self.memory_dim, 1)
        require_int("memory_value_dim", self.memory_value_dim, 1)
        require_int("seed", self.seed, 0)
        require_int("prefill_block", self.prefill_block, 1)
        if self.prefill_chunk is not None:
            require_int("prefill_chunk", self.prefill_chunk, 1)
        require_number("lam", self.lam, positive=False)
        object.__setattr__(self, "scorer", require_choice("scorer", self.scorer, ScorerKind))
        object.__setattr__(self, "lam", float(self.lam))
        require_int("priority_span", self.priority_span, 0)
        if self.priority_span and self.scorer.attention_fed:
            raise ValueError(
                f"priority_span={self.priority_span} spreads a score fixed when a token leaves "
                f"the window; scorer {self.scorer.value!r} rescores its pool every step: use "
                "priority_span=0 with it"
            )

    def to_dict(self) -> dict:
        """The fields as plain JSON values (the scorer kind as its name), as saved scorers,
        engine manifests and training checkpoints record them."""
        return {**asdict(self), "scorer": self.scorer.value}

    @property
    def capacity(self) -> int:
        """Cache slots per layer and KV head: ``sinks + window + topk``."""
        return self.sinks + self.window + self.topk

    @property
    def chunk_length(self) -> int:
        """Tokens per prefill chunk: ``prefill_chunk``, or the capacity when it is unset."""
        return self.capacity if self.prefill_chunk is None else self.prefill_chunk
