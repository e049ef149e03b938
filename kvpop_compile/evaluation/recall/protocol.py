"""The recall protocol: does the greedy answer to a long-range recall item come out exactly?

Items (:mod:`kvpop_compile.embedded.recall`) plant a binding early in real code and ask for its
value at the end; the answer is nowhere else in the item. The benchmark asks items of held-out
code in *family groups* (:data:`~kvpop_compile.embedded.recall_syntax.FAMILY_SPLITS`): by
default the trained families (the syntaxes and value alphabets models and scorers are trained
on) and the held-out ones (which no training step and no scorer selection saw), so that a
policy's rows show whether what it keeps generalises beyond the syntaxes it was trained on.
Results are keyed ``"<families>/<task>@<length>"`` (:func:`group_key`). Two ways to ask:

- ``prefill``: the whole prompt enters the cache (compressed to the budget by the policy), then
  the answer is decoded greedily;
- ``decode``: the prompt up to the question line enters the cache, the model generates a
  stretch of tokens greedily (the cache evicts during decode, as in a long reasoning trace),
  then the question is fed and the answer decoded. The stretch fills the model's positions up
  to twice the item's length, so the question arrives as far after the definition again.

Exact match: every answer byte equals the greedy token. Results are kept per item (1 or 0), so
any subset pools exactly and the report's bootstrap resamples items.

Items differ in prompt, question and answer length (syntax families, value alphabets), yet
share a batch: prompts are left-padded to the longest (the padding masked, and never held by a
bounded cache), and under ``decode`` every row's answer starts at the same position (prompt,
stretch, question), so the rows go in step, each feeding its own prompt byte, greedy token or
question byte. Each row gets what it would asked alone (up to floating-point rounding).

A run is long (an hour or more on a CPU), so methods already measured with the same settings can
be handed back in (``done``): they are kept, not rerun, and ``on_method`` sees the results after
each method, so that a caller can save them as it goes and a cut-off run resumes where it stopped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from tqdm.auto import tqdm

from ...config import ScorerKind, require_int
from ...embedded.corpus import encode
from ...embedded.recall import (
    CONTEXT_LENGTHS,
    TASKS,
    TRAINING_LENGTHS,
    RecallItem,
    recall_items,
)
from ...embedded.recall_syntax import FAMILY_SPLITS
from ...fingerprints import items_sha256
from ...kv_cache import cache_kwargs
from ...scorer_io import tensors_sha256
from ..methods import FULL, POLICIES, Method, build_model, trained_scorer
from ..methods import methods as all_methods
from ..protocols import model_cache

RECALL_PROTOCOLS = ("prefill", "decode")
RECALL_SEED = 0
RECALL_FAMILIES = ("train", "held_out")
"""The family groups the benchmark asks by default: trained and held-out families, both on
held-out code. Never ``validation``, which chooses among trained scorers."""


@dataclass
class RecallSettings:
    tasks: tuple[str, ...] = TASKS
    lengths: tuple[int, ...] = CONTEXT_LENGTHS
    items: int = 64  # held-out items per family group, task and length
    protocols: tuple[str, ...] = RECALL_PROTOCOLS
    batch: int = 16  # items per forward
    seed: int = RECALL_SEED
    max_stretch: int | None = None  # cap on the decode protocol's stretch (None: no cap)
    families: tuple[str, ...] = RECALL_FAMILIES  # family groups (FAMILY_SPLITS), in this order

    def __post_init__(self) -> None:
        require_int("items", self.items, 1)
        require_int("batch", self.batch, 1)
        for name, given, allowed in (
            ("families", self.families, FAMILY_SPLITS),
            ("tasks", self.tasks, TASKS),
            ("lengths", self.lengths, TRAINING_LENGTHS),
        ):
            _check_choices(name, given, allowed)


def _check_choices(name: str, given, allowed: tuple) -> None:
    """``given`` must be a non-empty sequence of distinct members of ``allowed``."""
    if isinstance(given, str | bytes) or not isinstance(given, tuple | list):
        raise TypeError(f"{name} must be a tuple of {allowed}, got {given!r}")
    unknown = [g for g in given if g not in allowed]
    repeated = sorted({g for g in given if list(given).count(g) > 1}, key=str)
    if not given or unknown or repeated:
        what = f"unknown {unknown}" if unknown else f"repeated {repeated}" if repeated else "none"
        raise ValueError(
            f"{name} must be distinct members of {allowed}, at least one; got {tuple(given)!r} "
            f"({what})"
        )


def group_key(families: str, task: str, length: int) -> str:
    """A results group's name: ``"held_out/chain@2048"``."""
    return f"{families}/{task}@{length}"


def split_group_key(key: str) -> tuple[str | None, str]:
    """``(families, "task@length")`` of a group name; families is None for a name without
    one (results written before items had families)."""
    families, slash, cell = key.rpartition("/")
    return (families if slash else None), cell


def decode_stretch(length: int, max_positions: int, cap: int | None = None) -> int:
    """Tokens generated between context and question in the ``decode`` protocol: as many as the
    item is long, within the model's positions (0 when there is no room) and ``cap``."""
    stretch = max(0, min(length, max_positions - length))
    return stretch if cap is None else min(stretch, cap)


def feed_tokens(
    model: nn.Module, ids: torch.Tensor, cache, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Continue ``cache`` with ``ids (B, T)``; next-token logits ``(B, vocab)``. A bounded
    cache takes the tokens as prefill chunks (equal to one step per token, up to rounding).

    ``mask (B, S)`` (1: token, 0: padding) covers every column fed so far, these ``T`` last, for
    rows left-padded to one length: each row's positions count from its first token, and the
    padding is never attended to (a bounded cache never holds it)."""
    if mask is None:
        seen = int(cache.get_seq_length())
        positions = torch.arange(seen, seen + ids.shape[1]).expand(ids.shape[0], -1)
        padding = {}
    else:
        positions = (mask.cumsum(dim=-1) - 1).clamp(min=0)[:, -ids.shape[1] :]
        padding = {"attention_mask": mask}
    out = model(
        input_ids=ids,
        position_ids=positions,
        **cache_kwargs(cache),
        **padding,
        use_cache=True,
        logits_to_keep=1,
    )
    return out.logits[:, -1]


def greedy_tokens(model: nn.Module, logits: torch.Tensor, cache, steps: int) -> torch.Tensor:
    """``steps`` greedy tokens ``(B, steps)`` from ``logits``, continuing ``cache``."""
    return _Batch(model, cache).greedy(logits, steps)


@torch.no_grad()
def greedy_continuations(model: nn.Module, prompts: list[torch.Tensor], steps: int) -> torch.Tensor:
    """The model's ``steps`` greedy tokens ``(B, steps)`` after each of ``prompts`` (token ids
    ``(P_b,)`` of any lengths, one batch: left-padded to the longest, each row continues as it
    would alone, up to floating-point rounding)."""
    if not prompts:
        raise ValueError("prompts must hold at least one prompt, got none")
    for index, prompt in enumerate(prompts):
        if not isinstance(prompt, torch.Tensor):
            raise TypeError(f"prompts[{index}] must be a tensor of token ids, got "
                            f"{type(prompt).__name__}")  # fmt: skip
        if prompt.dim() != 1 or prompt.numel() == 0:
            raise ValueError(f"prompts[{index}] must be a non-empty 1-D tensor of token ids, "
                             f"got shape {tuple(prompt.shape)}")  # fmt: skip
    require_int("steps", steps, 1)
    length = max(p.numel() for p in prompts)
    ids = torch.zeros(len(prompts), length, dtype=torch.long)  # (B, P), left-padded
    own = torch.zeros(len(prompts), length, dtype=torch.long)  # (B, P): 1 on a prompt's tokens
    for row, prompt in enumerate(prompts):
        ids[row, length - prompt.numel() :] = prompt
        own[row, length - prompt.numel() :] = 1
    batch = _Batch(model, model_cache(model))
    logits = batch.feed(ids, own if bool((own == 0).any()) else None)
    return batch.greedy(logits, steps)


class _Batch:
    """Rows asked together: one cache and, where the rows were left-padded to one length, the
    mask of every column fed so far ``(B, S)``, which each forward extends."""

    def __init__(self, model: nn.Module, cache):
        self.model, self.cache = model, cache
        self.mask: torch.Tensor | None = None  # (B, S) once a forward had padding

    def feed(self, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Feed ``ids (B, T)`` whose own mask is ``mask (B, T)`` (None: all tokens); next-token
        logits ``(B, vocab)``."""
        if self.mask is not None or mask is not None:
            own = torch.ones_like(ids) if mask is None else mask.long()
            self.mask = own if self.mask is None else torch.cat([self.mask, own], dim=1)
        return feed_tokens(self.model, ids, self.cache, self.mask)

    def greedy(self, logits: torch.Tensor, steps: int) -> torch.Tensor:
        """``steps`` greedy tokens ``(B, steps)`` from ``logits``, each fed in turn but the
        last."""
        tokens = []
        for step in range(steps):
            token = logits.argmax(dim=-1, keepdim=True)
            tokens.append(token)
            if step < steps - 1:
                logits = self.feed(token)
        return torch.cat(tokens, dim=1)


def _ask(
    model: nn.Module, items: list[RecallItem], protocol: str, stretch: int
) -> tuple[torch.Tensor, _Batch]:
    """Ask ``items`` under ``protocol``: the next-token logits ``(B, vocab)`` once the whole
    question is in the model's cache, and the batch holding that cache. Prompts of different
    lengths are left-padded to the longest (each row then runs as it would alone); questions
    and answers may differ in length too."""
    if protocol not in RECALL_PROTOCOLS:
        raise ValueError(f"protocol must be one of {', '.join(RECALL_PROTOCOLS)}; got {protocol!r}")
    if not items:
        raise ValueError("items must hold at least one RecallItem, got none")
    length = max(len(i.prompt) for i in items)
    prompts = torch.zeros(len(items), length, dtype=torch.long)  # (B, P), left-padded
    tokens = torch.zeros(len(items), length, dtype=torch.long)  # (B, P): 1 on a prompt's bytes
    for row, item in enumerate(items):
        prompts[row, length - len(item.prompt) :] = encode(item.prompt)
        tokens[row, length - len(item.prompt) :] = 1
    batch = _Batch(model, model_cache(model))
    padded = bool((tokens == 0).any())
    if protocol == "prefill":
        return batch.feed(prompts, tokens if padded else None), batch
    questions = torch.tensor([len(i.question) for i in items])  # (B,)
    return _ask_after_stretch(batch, prompts, tokens if padded else None, questions, stretch), batch


def _ask_after_stretch(
    batch: _Batch,
    prompts: torch.Tensor,
    tokens: torch.Tensor | None,
    questions: torch.Tensor,
    stretch: int,
) -> torch.Tensor:
    """The decode protocol for ``prompts (B, P)`` (``tokens (B, P)``: 1 where a left-padded
    prompt's own bytes are, None for no padding) whose question lines are ``questions (B,)``
    bytes long: row ``b``'s prompt up to its question line (the line's leading newline included,
    up to column ``cut_b = P - questions[b] + 1``), ``stretch`` greedy tokens, then the rest of
    the question; the next-token logits ``(B, vocab)``. Every row's answer starts at column
    ``P + stretch`` however its prompt is cut, so the rows go in step: the columns before the
    first cut are one forward, then each column is one forward in which each row feeds its
    prompt's next byte, its own greedy token or its question's next byte. A bounded cache takes
    a prefill chunk as it takes one step per token (design.md §6, invariant 2), so each row gets
    what it would asked alone, up to floating-point rounding."""
    length = prompts.shape[1]
    cuts = length - questions + 1  # (B,)
    first = int(cuts.min())
    logits = batch.feed(prompts[:, :first], None if tokens is None else tokens[:, :first])
    for at in range(first, length + stretch):
        prompt_byte = prompts[:, min(at, length - 1)]
        question_byte = prompts[:, max(at - stretch, 0)]
        token = torch.where(
            at < cuts,
            prompt_byte,
            torch.where(at < cuts + stretch, logits.argmax(dim=-1), question_byte),
        )
        # A row still in its padding here has a prompt shorter than another's question.
        own = None if tokens is None else tokens[:, min(at, length - 1)].where(at < cuts, 1)
        logits = batch.feed(token[:, None], None if own is None else own[:, None])
    return logits


def _answers(items: list[RecallItem]) -> tuple[torch.Tensor, torch.Tensor]:
    """The answers of ``items`` as ``(B, A)`` bytes, each padded with zeros to the longest
    one's ``A``, and ``(B, A)`` True where a byte is the answer's own."""
    longest = max(len(i.answer) for i in items)
    answers = torch.zeros(len(items), longest, dtype=torch.long)
    own = torch.zeros(len(items), longest, dtype=torch.bool)
    for row, item in enumerate(items):
        answers[row, : len(item.answer)] = encode(item.answer)
        own[row, : len(item.answer)] = True
    return answers, own


@torch.no_grad()
def greedy_answers(
    model: nn.Module, items: list[RecallItem], protocol: str, stretch: int = 0
) -> tuple[torch.Tensor, object]:
    """The greedy answers ``(B, A)`` to ``items`` under ``protocol``, ``A`` the longest answer's
    length, and the cache as it is after the last of those ``A`` tokens was chosen. Row ``b``'s
    answer is its first ``len(items[b].answer)`` tokens: items of any prompt, question and
    answer lengths are asked in one batch, each row as it would be alone (a longer answer beside
    it does not change its tokens, each of which sees only those before it)."""
    logits, batch = _ask(model, items, protocol, stretch)
    return batch.greedy(logits, max(len(i.answer) for i in items)), batch.cache


def answer_exactly(
    model: nn.Module,
    items: list[RecallItem],
    protocol: str,
    stretch: int = 0,
    batch: int | None = None,
) -> list[float]:
    """1.0 per item whose greedy answer is exact, else 0.0, in ``items``' order (arguments as
    :func:`greedy_answers`; the items are asked in batches of at most ``batch``, None: all in
    one)."""
    scores: list[float] = [0.0] * len(items)
    for rows in batches(items, batch):
        asked = [items[i] for i in rows]
        tokens, _ = greedy_answers(model, asked, protocol, stretch)
        answers, own = _answers(asked)
        hits = ((tokens == answers) | ~own).all(dim=1)
        for i, hit in zip(rows, hits.tolist(), strict=True):
            scores[i] = float(hit)
    return scores


def batches(items: list, batch: int | None = None) -> list[list[int]]:
    """Indices of ``items`` in runs of at most ``batch`` (None: one run), in order: the items
    of one run are asked in one batch."""
    if batch is not None:
        require_int("batch", batch, 1)
    size = batch or max(len(items), 1)
    return [list(range(at, min(at + size, len(items)))) for at in range(0, len(items), size)]


@torch.no_grad()
def answer_probability(
    model: nn.Module,
    items: list[RecallItem],
    protocol: str,
    stretch: int = 0,
    batch: int | None = None,
) -> list[float]:
    """Per item, the probability the model gives its exact answer: the product over the answer's
    tokens of each one's probability, the earlier ones fed in (teacher forcing; arguments as
    :func:`greedy_answers`). Exact match's smooth counterpart: it moves with every change to what
    the cache holds, not only with one that flips an argmax, so it ranks policies that answer
    the same number of items exactly. ``batch`` caps a forward, as for :func:`answer_exactly`."""
    scores: list[float] = [0.0] * len(items)
    for rows in batches(items, batch):
        asked = [items[i] for i in rows]
        logits, fed = _ask(model, asked, protocol, stretch)
        answers, own = _answers(asked)  # (B, A) each
        steps = [logits]
        for index in range(answers.shape[1] - 1):  # one token at a time, as the greedy answer is
            steps.append(fed.feed(answers[:, index : index + 1]))
        log_probs = torch.stack(steps, dim=1).float().log_softmax(dim=-1)  # (B, A, vocab)
        chosen = log_probs.gather(-1, answers.unsqueeze(-1)).squeeze(-1)  # (B, A)
        chosen = chosen.masked_fill(~own, 0.0)  # a shorter answer's padding counts for nothing
        for i, p in zip(rows, chosen.sum(dim=1).exp().double().tolist(), strict=True):
            scores[i] = p
    return scores


def recall_groups(settings: RecallSettings) -> dict[tuple[str, str, int], list[RecallItem]]:
    """(families, task, length) -> the items of held-out code a run with ``settings`` asks,
    family groups first, then tasks, then lengths, in the settings' order."""
    return {
        (families, task, length): recall_items(
            "held_out", task, length, settings.items, settings.seed, families=families
        )
        for families in settings.families
        for task in settings.tasks
        for length in settings.lengths
    }


def recall_settings_record(settings: RecallSettings, max_positions: int) -> dict:
    """What a run's results depend on besides its methods and model (JSON-ready): two runs
    whose records are equal asked the same items the same way, so their methods can share one
    report. ``items_sha256`` fingerprints the items themselves, which change with their
    generator whatever the settings; ``families`` sets apart results of items without family
    groups, whose groups have other names."""
    groups = recall_groups(settings)
    return {
        "items": settings.items,
        "families": list(settings.families),
        "tasks": list(settings.tasks),
        "lengths": list(settings.lengths),
        "protocols": list(settings.protocols),
        "stretch": {
            str(n): decode_stretch(n, max_positions, settings.max_stretch) for n in settings.lengths
        },
        "seed": settings.seed,
        "items_sha256": items_sha256(item for group in groups.values() for item in group),
    }


_REPORT_ORDER = [m.name for m in all_methods(POLICIES)]


def method_order(name: str) -> int:
    """Where method ``name`` sits in a report: full attention, then every policy at 75%, then at
    88% (the order :func:`~kvpop_compile.evaluation.methods.methods` lists them); an unknown name
    goes last."""
    return _REPORT_ORDER.index(name) if name in _REPORT_ORDER else len(_REPORT_ORDER)


def run_recall(
    original: nn.Module,
    methods: list[Method],
    *,
    settings: RecallSettings | None = None,
    scorer_root: str | Path | None = None,
    progress: bool = True,
    done: dict | None = None,
    on_method: Callable[[dict], None] | None = None,
) -> dict:
    """Every method on the held-out recall items: ``{"methods": {name: {"policy", "budget",
    protocol: {"families/task@length": [0/1 per item]}}}, ...}`` (JSON-ready; group names as
    :func:`group_key` writes them).

    ``done`` maps method names to records already measured with these settings (a saved run's
    ``methods``): those methods are not rerun, and every one of them is in the results, asked
    for this time or not. ``on_method`` gets the results so far after each method that ran.
    """
    settings = settings or RecallSettings()
    unknown = set(settings.protocols) - set(RECALL_PROTOCOLS)
    if unknown:
        raise ValueError(
            f"protocols must be among {', '.join(RECALL_PROTOCOLS)}; got {sorted(unknown)}"
        )
    max_positions = original.config.max_position_embeddings
    header = recall_settings_record(settings, max_positions)
    results = dict(done or {})
    if FULL not in results and all(m.name != FULL for m in methods):
        raise ValueError(
            f"the recall report compares every method with full attention: include {FULL!r} "
            "among the methods"
        )
    for method in methods:  # a saved row is kept only if it describes this very method
        if method.name in results:
            differs = method.differs_from(results[method.name], _row_record(method, scorer_root))
            if differs:
                key, theirs, ours = differs
                raise ValueError(
                    f"cannot resume {method.name}: it was run with {key} {theirs}, this run asks "
                    f"{ours}; give the saved run's settings, or another --out"
                )
    to_run = [m for m in methods if m.name not in results]
    groups = recall_groups(settings)
    work = len(to_run) * len(groups) * len(settings.protocols)
    bar = tqdm(total=work, disable=not progress, desc="recall", unit="group")

    def snapshot() -> dict:
        ordered = sorted(results, key=method_order)
        return {**header, "methods": {name: results[name] for name in ordered}}

    for method in to_run:
        bar.set_postfix_str(method.name)
        model = build_model(original, method, scorer_root)
        record = _row_record(method, scorer_root)
        for protocol in settings.protocols:
            per_group = {}
            for (families, task, length), items in groups.items():
                stretch = 0
                if protocol == "decode":
                    stretch = decode_stretch(length, max_positions, settings.max_stretch)
                if protocol == "decode" and stretch == 0:
                    bar.update()
                    continue  # no room for a stretch: the same as the prefill protocol
                exact = answer_exactly(model, items, protocol, stretch, settings.batch)
                per_group[group_key(families, task, length)] = exact
                bar.update()
            record[protocol] = per_group
        results[method.name] = record
        if on_method is not None:
            on_method(snapshot())
    bar.close()
    return snapshot()


def _row_record(method: Method, scorer_root) -> dict:
    """What a results row records of ``method``: :meth:`Method.record`, and for a learned
    method its trained scorer's tensors digest (``scorer_sha256``), so that a resumed run can
    tell a retrained scorer from the one a saved row was measured with."""
    record = method.record()
    if method.policy is not None and ScorerKind(method.policy).learned:
        record["scorer_sha256"] = tensors_sha256(trained_scorer(method, scorer_root))
    return record
