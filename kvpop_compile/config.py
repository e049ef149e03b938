"""KVpop configuration: the cache budget and the scorer that decides what stays in it."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from enum import Enum
from functools import cached_property


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


def layer_budgets(window: object, topk: object) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """``window`` and ``topk`` as per-layer tuples of one length when either lists one value per
    layer (a list or tuple; a single integer stands for every layer), or ``None`` when both are
    single integers. Raises ``ValueError`` naming the bad value."""
    listed = [value for value in (window, topk) if isinstance(value, (list, tuple))]
    if not listed:
        require_int("window", window, 1)
        require_int("topk", topk, 0)
        return None
    layers = len(listed[0])
    if layers < 1 or any(len(value) != layers for value in listed):
        raise ValueError(
            "a per-layer budget lists one window and one topk per layer, in lists of one "
            f"length of at least 1; got window={window!r}, topk={topk!r}"
        )

    def per_layer(name: str, value: object, minimum: int) -> tuple[int, ...]:
        values = tuple(value) if isinstance(value, (list, tuple)) else (value,) * layers
        for i, v in enumerate(values):
            require_int(f"{name}[{i}]", v, minimum)
        return values

    return per_layer("window", window, 1), per_layer("topk", topk, 0)


@dataclass(frozen=True)
class KVpopConfig:
    """The per-layer, per-KV-head cache budget and the policy that fills it.

    Capacity is ``sinks + window + topk`` slots: the first ``sinks`` positions, the ``window``
    most recent tokens (the current one included) and a pool of the ``topk`` older tokens of
    highest priority ``rhat_t + lam * t``. With ``priority_span = P > 0`` a token's ``rhat_t`` is
    first raised to the highest score among itself and the ``P`` tokens that left the window
    just before it, so a token right after one the scorer rates highly (the other bytes of a
    number, the rest of a name) is kept with it.

    ``window`` and ``topk`` may each list one value per layer (a *per-layer budget*): layer
    ``i`` then keeps ``sinks + window[i] + topk[i]`` slots per KV head (:meth:`layer`). A model
    whose layers differ in what they need from far back holds the same total memory better so
    than with one capacity for all (docs/design.md §2).
    """

    sinks: int = 4
    window: int | tuple[int, ...] = 256
    topk: int | tuple[int, ...] = 3836
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
        budgets = layer_budgets(self.window, self.topk)
        if budgets is not None:
            object.__setattr__(self, "window", budgets[0])
            object.__setattr__(self, "topk", budgets[1])
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
        """The fields as plain JSON values (the scorer kind as its name, a per-layer budget as
        lists), as saved scorers, engine manifests and training checkpoints record them."""
        plain = {key: list(v) if isinstance(v, tuple) else v for key, v in asdict(self).items()}
        return {**plain, "scorer": self.scorer.value}

    @property
    def per_layer(self) -> int | None:
        """How many layers a per-layer budget lists; ``None`` for one budget for every layer."""
        return len(self.window) if isinstance(self.window, tuple) else None

    @cached_property
    def _layers(self) -> tuple[KVpopConfig, ...]:
        # Made once, so each layer's config is one object: the attention and the cache layer
        # compare theirs by identity first (under compilation, values may be symbolic).
        return tuple(
            replace(self, window=window, topk=topk)
            for window, topk in zip(self.window, self.topk, strict=True)
        )

    def layer(self, index: int) -> KVpopConfig:
        """Layer ``index``'s budget as a config of one budget (this config itself unless it is a
        per-layer one). ``ValueError`` for an index the per-layer budget does not list."""
        if self.per_layer is None:
            return self
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < self.per_layer:
            raise ValueError(
                f"layer index must be an integer from 0 to {self.per_layer - 1} (the per-layer "
                f"budget lists {self.per_layer} layers), got {index!r}"
            )
        return self._layers[index]

    def check_layers(self, num_layers: int) -> None:
        """Raise ``ValueError`` unless a per-layer budget lists exactly ``num_layers`` layers."""
        if self.per_layer is not None and self.per_layer != num_layers:
            raise ValueError(
                f"the per-layer budget lists {self.per_layer} layers (window={list(self.window)}, "
                f"topk={list(self.topk)}), the model has {num_layers}: list one per layer"
            )

    @property
    def capacities(self) -> tuple[int, ...]:
        """Cache slots per KV head of each layer a per-layer budget lists; one entry otherwise."""
        if self.per_layer is None:
            return (self.capacity,)
        return tuple(config.capacity for config in self._layers)

    @property
    def capacity(self) -> int:
        """Cache slots per layer and KV head: ``sinks + window + topk``. A per-layer budget has
        no one capacity: ``ValueError``, naming :attr:`capacities` and :meth:`layer`."""
        if self.per_layer is not None:
            raise ValueError(
                f"a per-layer budget keeps {list(self.capacities)} slots per KV head in its "
                "layers, not one capacity: read config.capacities, config.layer(i).capacity or "
                "config.max_capacity"
            )
        return self.sinks + self.window + self.topk

    @property
    def max_capacity(self) -> int:
        """The most cache slots any layer keeps per KV head."""
        return max(self.capacities)

    @property
    def chunk_length(self) -> int:
        """Tokens per prefill chunk: ``prefill_chunk``, or the (largest layer's) capacity when
        it is unset."""
        return self.max_capacity if self.prefill_chunk is None else self.prefill_chunk
