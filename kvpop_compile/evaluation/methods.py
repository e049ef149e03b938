"""What the quality benchmark compares: full attention and every policy at each budget.

Budgets are named by the compression of the benchmark's sequence: at "75%" each layer and KV
head keeps a quarter of the sequence's tokens (512 of :data:`~.data.SEQUENCE_LENGTH` = 2048), at
"88%" an eighth (256, 12.5%); a shorter or longer sequence scales the capacity with it. Sinks
and window are counted inside the budget. The heuristics run at :data:`SINKS` sinks and a
:data:`WINDOW`-token window; a learned policy runs at the window its trained scorer was saved
with (a window is part of what a scorer was chosen for, like its ``priority_span``), and that
is :data:`WINDOW` too unless its ``scorer.json`` says otherwise. A scorer saved with a per-layer
budget runs at it: its layers' capacities differ and average the budget's capacity, so the
cache holds the same memory as every other method's at that budget.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from ..config import KVpopConfig, ScorerKind, require_int
from ..scorer_io import load_scorer, saved_config
from ..transform import transform
from .data import SEQUENCE_LENGTH

SINKS, WINDOW = 4, 64
KEPT_FRACTION = {"75%": 4, "88%": 8}
"""Compression label -> how many times the sequence is longer than the capacity."""


_UNWRITTEN = {"priority_span": 0, "window": WINDOW, "lam": 0.0, "topk": None}
"""A method's settings that :meth:`Method.record` leaves out of a file when they take these
values, as every row did before they could differ."""


SCORER_SIZES = ("scorer_hidden", "memory_dim", "memory_value_dim")
"""The :class:`KVpopConfig` fields that shape a scorer's tensors: a learned method takes them
from its saved scorer, so that a scorer of any size a user trained runs in the benchmark."""


def capacities(length: int = SEQUENCE_LENGTH) -> dict[str, int]:
    """Compression label -> capacity (tokens kept per layer and KV head) for sequences of
    ``length`` tokens."""
    require_int("length", length, 1)
    return {budget: length // share for budget, share in KEPT_FRACTION.items()}


BUDGETS = capacities()
"""Compression label -> capacity at the benchmark's :data:`~.data.SEQUENCE_LENGTH`."""
POLICIES = tuple(kind.value for kind in ScorerKind)
"""memory, mlp, window (StreamingLLM), random, knorm, h2o, tova."""
FULL = "full"
NO_PRESS = "none"
"""kvpress's run without a press (its own full attention), in the results files that
``benchmarks/kvpress_eval.py`` writes."""
EMBEDDED_SCORERS = Path(__file__).resolve().parents[1] / "embedded" / "scorers"
"""Folder of the scorers trained for the embedded model, one sub-folder per policy and budget."""


def budget_config(
    policy: str,
    capacity: int,
    priority_span: int = 0,
    window: int | tuple[int, ...] = WINDOW,
    topk: tuple[int, ...] | None = None,
) -> KVpopConfig:
    """The benchmark's config for ``policy`` keeping ``capacity`` tokens: :data:`SINKS` sinks,
    the ``window`` most recent tokens, and a pool of the rest. With per-layer ``window`` and
    ``topk`` tuples, a per-layer budget whose layers' capacities average ``capacity``."""
    if topk is not None:
        config = KVpopConfig(
            sinks=SINKS, window=window, topk=topk, scorer=policy, priority_span=priority_span
        )
        if sum(config.capacities) != capacity * config.per_layer:
            raise ValueError(
                f"a per-layer budget at capacity {capacity} keeps {capacity} slots per layer "
                f"on average; window={list(config.window)} and topk={list(config.topk)} keep "
                f"{list(config.capacities)}"
            )
        return config
    require_int("window", window, 1)
    if capacity <= SINKS + window:
        raise ValueError(
            f"capacity must exceed sinks + window = {SINKS + window} so that the pool has a "
            f"slot, got {capacity}"
        )
    return KVpopConfig(
        sinks=SINKS, window=window, topk=capacity - SINKS - window, scorer=policy,
        priority_span=priority_span,
    )  # fmt: skip


def scorer_folder(policy: str, capacity: int, root: str | Path | None = None) -> Path:
    """The trained scorer of ``policy`` at ``capacity``: ``root/<policy>-<capacity>``."""
    return Path(root if root is not None else EMBEDDED_SCORERS) / f"{policy}-{capacity}"


@dataclass(frozen=True)
class Method:
    """One row of the benchmark: ``policy`` at ``budget`` (both None for full attention) of
    sequences of ``length`` tokens, its scores spread over ``priority_span`` tokens
    (``KVpopConfig.priority_span``), the ``window`` most recent tokens always kept, and ``lam``
    the recency term of its priority (``KVpopConfig.lam``: a learned scorer's saved one).
    ``topk`` None: one budget in every layer, its pool the rest of the capacity; a tuple: the
    per-layer budget a learned scorer was saved with, ``window`` a tuple beside it."""

    policy: str | None
    budget: str | None
    length: int = SEQUENCE_LENGTH
    priority_span: int = 0
    window: int | tuple[int, ...] = WINDOW
    lam: float = 0.0
    topk: tuple[int, ...] | None = None

    def record(self) -> dict:
        """What a results file says of the method: policy, budget, and a span or window where
        they differ from the defaults (so files of runs without them read as before), tuples as
        lists (as the file reads back)."""
        record: dict = {"policy": self.policy, "budget": self.budget}
        for key, default in _UNWRITTEN.items():
            value = getattr(self, key)
            if value != default:
                record[key] = list(value) if isinstance(value, tuple) else value
        return record

    def differs_from(
        self, saved: dict, record: dict | None = None
    ) -> tuple[str, object, object] | None:
        """The first field of ``record`` (default :meth:`record`; a run may add fields such as
        its scorer's digest) on which ``saved`` (a results file's row) describes another method,
        as ``(field, saved value, this method's)``; None when it is this one."""
        ours = {**_UNWRITTEN, **(self.record() if record is None else record)}
        for key, value in ours.items():
            theirs = saved.get(key, _UNWRITTEN.get(key))
            if theirs != value:
                return key, theirs, value
        return None

    @property
    def name(self) -> str:
        return FULL if self.policy is None else f"{self.policy} @ {self.budget}"

    @property
    def capacity(self) -> int | None:
        return None if self.budget is None else capacities(self.length)[self.budget]


def methods(
    policies=POLICIES,
    budgets=tuple(BUDGETS),
    length: int = SEQUENCE_LENGTH,
    priority_span: int | None = 0,
    scorer_root: str | Path | None = None,
) -> list[Method]:
    """Full attention, then every policy at every budget of ``length``-token sequences, the
    learned ones spreading their scores over ``priority_span`` tokens (the heuristics run as
    published, so that they stay the baselines they are named after). ``priority_span`` None:
    each learned method takes the span its trained scorer under ``scorer_root`` was saved with
    (default root: the scorers shipped with the embedded model). A learned method keeps the
    window its trained scorer was saved with, whatever ``priority_span`` says; every other
    method keeps :data:`WINDOW`. A learned method also keeps its saved scorer's ``lam``: the
    recency term is part of the priority the scorer was trained and chosen with.

    Unknown names raise ``ValueError``, and so does a ``length`` that leaves a budget no pool
    slot beyond the sinks and window.
    """
    for budget in budgets:
        if budget not in BUDGETS:
            raise ValueError(f"budget must be one of {', '.join(BUDGETS)}; got {budget!r}")
    for policy in policies:
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}; got {policy!r}")
    if priority_span is not None:
        require_int("priority_span", priority_span, 0)
    kept = capacities(length)

    def saved(policy: str, budget: str) -> KVpopConfig | None:
        """The config a learned policy's scorer for ``budget`` was saved with; None for a
        heuristic, or where there is no scorer (a learned method without one is refused by
        name before anything runs: :func:`check_scorers`)."""
        folder = scorer_folder(policy, kept[budget], scorer_root)
        return saved_config(folder) if ScorerKind(policy).learned and folder.is_dir() else None

    def method(policy: str, budget: str) -> Method:
        config = saved(policy, budget)
        span = priority_span if ScorerKind(policy).learned else 0
        if span is None:
            span = config.priority_span if config is not None else 0
        window = config.window if config is not None else WINDOW
        lam = config.lam if config is not None else 0.0
        topk = config.topk if config is not None and config.per_layer is not None else None
        return Method(policy, budget, length, span, window, lam, topk)

    listed = [Method(None, None, length)] + [method(p, b) for b in budgets for p in policies]
    for m in listed[1:]:
        if m.topk is not None:
            budget_config(m.policy, m.capacity, m.priority_span, m.window, m.topk)  # checks
        elif m.capacity <= SINKS + m.window:
            shortest = (SINKS + m.window + 1) * KEPT_FRACTION[m.budget]
            raise ValueError(
                f"sequence length {length} keeps {m.capacity} tokens at the {m.budget} budget, "
                f"but {m.name} needs more than sinks + window = {SINKS + m.window}; use a "
                f"length of at least {shortest}"
            )
    return listed


def method_notes(records: dict) -> list[str]:
    """Lines naming the methods of ``records`` (a results file's ``methods``) that spread their
    scores (``priority_span``), keep another window than :data:`WINDOW` or add a recency term
    (``lam``); none when no method did."""
    notes = []
    spread = {name: r["priority_span"] for name, r in records.items() if r.get("priority_span")}
    if spread:
        spans = ", ".join(f"{name} {span}" for name, span in spread.items())
        notes.append(
            "priority_span (each token's score spread over the tokens that leave the window "
            f"after it): {spans}, the span each trained scorer was saved with unless the run "
            "asked for one; full attention and the heuristic policies run without it"
        )
    per_layer = {name: r for name, r in records.items() if r.get("topk") is not None}
    if per_layer:
        budgets = "; ".join(
            f"{name}: " + ", ".join(f"{SINKS + w + k}" for w, k in zip(r["window"], r["topk"],
                                                                       strict=True))
            + f" (windows {', '.join(map(str, r['window']))})"
            for name, r in per_layer.items()
        )  # fmt: skip
        notes.append(
            "per-layer budget (slots per KV head in each layer, first layer first, averaging "
            f"the budget's capacity, so the cache holds the same memory): {budgets}, the "
            "budget each trained scorer was saved with; every other method keeps the budget's "
            "capacity in every layer"
        )
    wider = {name: r["window"] for name, r in records.items()
             if r.get("topk") is None and r.get("window", WINDOW) != WINDOW}  # fmt: skip
    if wider:
        windows = ", ".join(f"{name} {window}" for name, window in wider.items())
        notes.append(
            f"window (the most recent tokens always kept, inside the budget): {windows}, the "
            f"window each trained scorer was saved with; every other method keeps {WINDOW}"
        )
    recency = {name: r["lam"] for name, r in records.items() if r.get("lam")}
    if recency:
        lams = ", ".join(f"{name} {lam:g}" for name, lam in recency.items())
        notes.append(
            f"lam (a token's priority rises by lam per position, so newer tokens are kept "
            f"first among equal scores): {lams}, the lam each trained scorer was saved with; "
            "every other method has none"
        )
    return notes


def runnable_policies(
    requested: tuple[str, ...] | None, scorers: bool
) -> tuple[tuple[str, ...], list[str]]:
    """The policies to run and a note on any left out.

    ``requested`` None means every policy; where no trained scorers are at hand (``scorers``
    False: a user's model without ``--scorer-root``) that is every heuristic policy, with a note
    saying so, and a learned policy requested by name raises ``ValueError``.
    """
    wanted = tuple(requested) if requested is not None else POLICIES
    learned = [p for p in wanted if ScorerKind(p).learned]
    if scorers or not learned:
        return wanted, []
    if requested is not None:
        raise ValueError(
            f"--policies {' '.join(learned)}: learned policies need scorers trained for this "
            "model; pass --scorer-root (a folder of <policy>-<capacity>/ scorers), or leave them "
            "out of --policies"
        )
    heuristic = tuple(p for p in wanted if p not in learned)
    note = (
        f"The learned policies ({', '.join(learned)}) were not run: they need scorers trained "
        "for this model (--scorer-root, a folder of <policy>-<capacity>/ scorers)."
    )
    return heuristic, [note]


def trained_scorer(method: Method, root: str | Path | None = None) -> Path:
    """The folder of ``method``'s trained scorer under ``root`` (default: the scorers shipped
    with the embedded model); ``FileNotFoundError`` naming it when it is missing."""
    folder = scorer_folder(method.policy, method.capacity, root)
    if not folder.is_dir():
        hint = "train one with scripts/train_embedded_scorers.py or pass --scorer-root"
        if root is None and method.length != SEQUENCE_LENGTH:
            hint = (
                f"the shipped scorers are for sequences of {SEQUENCE_LENGTH} tokens: pass "
                "--scorer-root, or --policies without memory and mlp"
            )
        raise FileNotFoundError(
            f"no trained {method.policy} scorer for capacity {method.capacity} at {folder}; {hint}"
        )
    return folder


def check_scorers(methods: list[Method], root: str | Path | None = None) -> None:
    """Raise ``FileNotFoundError`` (see :func:`trained_scorer`) before anything runs when a
    learned method's scorer is missing."""
    for method in methods:
        if method.policy is not None and ScorerKind(method.policy).learned:
            trained_scorer(method, root)


def build_model(original: nn.Module, method: Method, scorer_root: str | Path | None = None):
    """``original`` itself for full attention; else a transformed copy with the method's policy.

    Learned policies load their trained scorer from ``scorer_root`` (default: the scorers
    shipped with the embedded model), built at the sizes it was saved with
    (:data:`SCORER_SIZES`); a missing one raises ``FileNotFoundError``.
    """
    if method.policy is None:
        return original
    config = budget_config(
        method.policy, method.capacity, method.priority_span, method.window, method.topk
    )
    config = dataclasses.replace(config, lam=method.lam)
    if not config.scorer.learned:
        return transform(copy.deepcopy(original), config)
    folder = trained_scorer(method, scorer_root)
    saved = saved_config(folder)
    config = dataclasses.replace(config, **{size: getattr(saved, size) for size in SCORER_SIZES})
    return load_scorer(transform(copy.deepcopy(original), config), folder)
