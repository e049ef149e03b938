"""``kvpop-compile demo``: a long-range recall question that eviction decides.

The embedded model (shipped with the package, or a byte-level Qwen3 given with ``--model``)
answers recall items (:mod:`kvpop_compile.embedded.recall`) of held-out code in held-out
families: bindings planted early in real code the model never trained on, written in syntaxes
and value alphabets that neither the model nor the scorers saw, and a question about them at
the end of the context. Three caches answer the same items: full attention, KVpop with its
trained ``memory`` scorer (or ``--scorer``), and a heuristic baseline (``--policy``,
StreamingLLM's ``window`` by default) at the same budget. The report prints each one's
exact-match accuracy over the items (measured here, on every item of the run), then one item
side by side — the first on which full attention and KVpop answer right and the baseline does
not — with the cache bytes, and a PNG of which positions each bounded cache holds when the
question is answered, the lines the answer follows from marked.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from pathlib import Path

from torch import nn
from tqdm.auto import tqdm

from ...config import KVpopConfig, require_int
from ...embedded import EMBEDDED_MODEL, load_embedded_model
from ...embedded.recall import CONTEXT_LENGTHS, TASKS, RecallItem, recall_items
from ...kv_cache import cache_bytes
from ...scorer_io import load_scorer, saved_config
from ...transform import transform
from ..methods import BUDGETS, WINDOW, scorer_folder
from ..recall.protocol import RECALL_SEED, answer_exactly, greedy_answers

DEFAULT_CAPACITY = BUDGETS["88%"]
DEFAULT_ITEMS = 8  # items per task: 24 in all, under a minute on one core of a 2-core CPU
BATCH = 16  # items per forward, at most
FAMILIES = "held_out"  # the family group asked: syntaxes no training step saw


@dataclass
class Contender:
    """One cache answering the items: its label, the model and the KVpop config (None: full)."""

    label: str
    model: nn.Module
    config: KVpopConfig | None


@dataclass
class Example:
    """The item shown side by side, with each contender's answer and cache."""

    item: RecallItem
    index: int  # position in the run's item list
    answers: dict[str, bytes]  # label -> greedy answer
    cache_bytes: dict[str, int]  # label -> bytes its cache holds at the answer
    caches: dict[str, object]  # label -> the cache itself (bounded ones are drawn)
    chosen_because: str


@dataclass
class DemoResult:
    contenders: list[Contender]
    items: list[RecallItem]
    exact: dict[str, list[float]]  # label -> 1/0 per item
    example: Example
    image: Path | None

    def accuracy(self, label: str, task: str | None = None) -> tuple[int, int]:
        """Right answers and items, over one task or all."""
        marks = [m for m, i in zip(self.exact[label], self.items, strict=True)
                 if task is None or i.task == task]  # fmt: skip
        return int(sum(marks)), len(marks)

    def report(self) -> list[str]:
        bounded = next(c.config for c in self.contenders if c.config is not None)
        context = self.items[0].context_length
        per_task = len(self.items) // len(TASKS)
        families = sorted({i.family for i in self.items})
        lines = [
            f"Held-out recall at {context} tokens: {per_task} items per task of code never "
            "trained on, in held-out families (binding and question syntaxes and value "
            f"alphabets no model or scorer was trained on; here {', '.join(families)}). "
            + budget_sentence(self.contenders, context)
            + (
                f" KVpop spreads each score over the {bounded.priority_span} tokens that leave the "
                "window after it (priority_span)."
                if bounded.priority_span
                else ""
            )
            + (
                f" KVpop's priority rises by {bounded.lam:g} per position, so that of two tokens "
                "scored alike the newer stays (lam)."
                if bounded.lam
                else ""
            ),
            "",
            f"{'exact answers':<34}" + "".join(f"{t:>11}" for t in TASKS) + f"{'all':>14}",
        ]
        for c in self.contenders:
            cells = "".join(f"{'{}/{}'.format(*self.accuracy(c.label, t)):>11}" for t in TASKS)
            right, total = self.accuracy(c.label)
            lines.append(f"{c.label:<34}{cells}{right:>7}/{total} {right / total:>4.0%}")
        e = self.example
        evidence = " and ".join(
            f"{e.item.prompt[start:end].decode('utf-8', 'replace').strip()!r} at byte {start}"
            for start, end in e.item.evidence
        )
        question = e.item.question[1:]  # the last line, without the newline before it
        lines += [
            "",
            f"Item {e.index} ({e.item.task}, {e.item.family} syntax, {e.item.alphabet} values; "
            f"{e.chosen_because}): the answer follows from {evidence}, the question at byte "
            f"{len(e.item.prompt) - len(question)}:",
            f"  ...{question.decode('utf-8', 'replace')!r} -> expected "
            f"{e.item.answer.decode('utf-8', 'replace')!r}",
        ]
        for c in self.contenders:
            answer = e.answers[c.label]
            verdict = "right" if answer == e.item.answer else "wrong"
            lines.append(
                f"  {c.label:<32} {answer.decode('utf-8', 'replace')!r:>17} {verdict:<6}"
                f" cache {e.cache_bytes[c.label]:>11,d} B"
            )
        if self.image is not None:
            lines += ["", f"What each bounded cache holds at the answer, per layer: {self.image}"]
        return lines


def prepare(
    *,
    model_path: str | Path | None = None,
    scorer: str | Path | None = None,
    policy: str = "window",
    capacity: int = DEFAULT_CAPACITY,
) -> list[Contender]:
    """Full attention, KVpop (``scorer``, or the shipped ``memory`` scorer at ``capacity``)
    and the baseline ``policy`` at KVpop's budget (the same sinks, window and pool)."""
    folder = Path(model_path) if model_path is not None else EMBEDDED_MODEL
    model = load_embedded_model(path=folder)
    if model.config.vocab_size != 256:
        raise ValueError(
            f"--model {folder}: the recall items are UTF-8 bytes, so the demo needs a byte-level "
            f"model (vocab_size 256), got vocab_size {model.config.vocab_size}; measure your own "
            "model on your own text with `kvpop-compile eval --model PATH --data PATH`"
        )
    if scorer is not None:
        config, scorer_path = saved_config(scorer), Path(scorer)
    elif model_path is None:
        scorer_path = scorer_folder("memory", capacity)
        if not scorer_path.is_dir():
            shipped = sorted(p.name for p in scorer_path.parent.glob("memory-*"))
            raise FileNotFoundError(
                f"no shipped memory scorer for capacity {capacity} at {scorer_path} (shipped: "
                f"{', '.join(shipped) or 'none'}); pass --scorer-path PATH"
            )
        config = saved_config(scorer_path)
    else:
        raise ValueError(
            "the shipped scorers were trained for the embedded model; with --model pass "
            "--scorer-path PATH (trained with `kvpop-compile train`)"
        )
    # The heuristic runs as published: no score spread and no recency term, whatever the
    # scorer was saved with, and one budget in every layer, as in the benchmark: beside a
    # per-layer budget, the same memory at the benchmark's window.
    baseline = dataclasses.replace(config, scorer=policy, priority_span=0, lam=0.0)
    if config.per_layer is not None:
        mean, rest = divmod(sum(config.capacities), config.per_layer)
        if rest or mean <= config.sinks + WINDOW:
            raise ValueError(
                f"the scorer keeps a per-layer budget of {list(config.capacities)} slots; the "
                f"baseline keeps their average in every layer, which must be a whole number "
                f"above sinks + window = {config.sinks + WINDOW}"
            )
        baseline = dataclasses.replace(baseline, window=WINDOW, topk=mean - config.sinks - WINDOW)
    if baseline.scorer.learned:
        raise ValueError(
            f"--policy {policy} is learned; the baseline is a heuristic: window, random, knorm, "
            "h2o or tova"
        )
    kvpop = transform(copy.deepcopy(model), config)
    load_scorer(kvpop, scorer_path)
    return [
        Contender("full attention", model, None),
        Contender(f"KVpop, trained {config.scorer.value} scorer", kvpop, config),
        Contender(
            f"{baseline.scorer.value} (heuristic)",
            transform(copy.deepcopy(model), baseline),
            baseline,
        ),  # fmt: skip
    ]


def budget_sentence(contenders: list[Contender], context: int) -> str:
    """What the bounded caches keep, in one or two sentences: per layer and KV head, and the
    compression of the ``context``-token prompt over all layers."""
    configs = [(c.label, c.config) for c in contenders if c.config is not None]

    def kept(config: KVpopConfig) -> str:
        if config.per_layer is None:
            return (f"{config.sinks} sinks + {config.window} window + {config.topk} pool = "
                    f"{config.capacity} tokens per layer and KV head")  # fmt: skip
        per_layer = ", ".join(f"{c}" for c in config.capacities)
        windows = ", ".join(f"{w}" for w in config.window)
        return (f"a per-layer budget of {per_layer} tokens per KV head in layers 0 to "
                f"{config.per_layer - 1} ({config.sinks} sinks, windows {windows}, the rest "
                "pool)")  # fmt: skip

    def compression(config: KVpopConfig) -> float:
        return 1 - sum(config.capacities) / (len(config.capacities) * context)

    budgets = {(config.sinks, config.window, config.topk) for _, config in configs}
    if len(budgets) == 1:
        config = configs[0][1]
        return f"Bounded caches keep {kept(config)} ({compression(config):.0%} compression)."
    if len({round(compression(config), 6) for _, config in configs}) == 1:
        per = "; ".join(f"{label}: {kept(config)}" for label, config in configs)
        return (f"Bounded caches hold the same memory ({compression(configs[0][1]):.0%} "
                f"compression): {per}.")  # fmt: skip
    per = "; ".join(f"{label}: {kept(config)} ({compression(config):.0%} compression)"
                    for label, config in configs)  # fmt: skip
    return f"Bounded caches keep {per}."


def _held_out_items(per_task: int, context: int) -> list[RecallItem]:
    """``per_task`` items of each task, of held-out code in held-out families, interleaved
    (item ``i`` of every task, then ``i + 1``)."""
    groups = [
        recall_items("held_out", task, context, per_task, RECALL_SEED, families=FAMILIES)
        for task in TASKS
    ]
    return [group[i] for i in range(per_task) for group in groups]


def _measure(contenders: list[Contender], items: list[RecallItem], progress: bool):
    """label -> 1/0 per item, in ``items``' order (answered in batches of at most ``BATCH``)."""
    exact = {}
    with tqdm(total=len(contenders) * len(items), desc="recall", unit="item",
              disable=not progress) as bar:  # fmt: skip
        for c in contenders:
            bar.set_postfix_str(c.label)
            exact[c.label] = answer_exactly(c.model, items, "prefill", batch=BATCH)
            bar.update(len(items))
    return exact


def _choose_example(contenders, items, exact) -> Example:
    """The first item full attention and KVpop answer right and the baseline wrong (else the
    closest thing to it, said so), answered again alone to keep each cache."""
    full, kvpop, baseline = (exact[c.label] for c in contenders)
    wanted = [
        (lambda i: full[i] and kvpop[i] and not baseline[i],
         "the first item where full attention and KVpop are right and the heuristic is not"),
        (lambda i: kvpop[i] and not baseline[i],
         "no item has full attention and KVpop right and the heuristic wrong; the first "
         "where KVpop is right and the heuristic wrong"),
        (lambda i: True, "no item separates KVpop from the heuristic; the first item"),
    ]  # fmt: skip
    index, because = next(
        (i, because) for test, because in wanted for i in range(len(items)) if test(i)
    )
    item = items[index]
    answers, sizes, caches = {}, {}, {}
    for c in contenders:
        tokens, cache = greedy_answers(c.model, [item], "prefill")
        answers[c.label] = bytes(tokens[0].tolist())
        sizes[c.label], caches[c.label] = cache_bytes(cache), cache
    return Example(item, index, answers, sizes, caches, because)


def run_demo(
    *,
    items: int = DEFAULT_ITEMS,
    context: int = CONTEXT_LENGTHS[-1],
    model_path: str | Path | None = None,
    scorer: str | Path | None = None,
    policy: str = "window",
    capacity: int = DEFAULT_CAPACITY,
    image: str | Path | None = "kvpop_demo.png",
    progress: bool = True,
) -> DemoResult:
    """Measure the three caches on ``items`` items per task of held-out code in held-out
    families at ``context`` tokens, show one item side by side, and draw ``image`` if given."""
    require_int("items", items, 1)
    if context not in CONTEXT_LENGTHS:
        raise ValueError(f"context must be one of {CONTEXT_LENGTHS}, got {context!r}")
    contenders = prepare(model_path=model_path, scorer=scorer, policy=policy, capacity=capacity)
    limit = contenders[0].model.config.max_position_embeddings
    if context > limit:
        raise ValueError(f"context {context} exceeds the model's {limit} positions")
    chosen = _held_out_items(items, context)
    exact = _measure(contenders, chosen, progress)
    result = DemoResult(contenders, chosen, exact, _choose_example(contenders, chosen, exact), None)
    if image is not None:
        from .plot import plot_kept_positions

        result.image = plot_kept_positions(result, Path(image))
    return result
