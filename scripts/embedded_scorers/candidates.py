"""What a training run's candidate scorers are measured and chosen by."""

from __future__ import annotations

import functools
import time
from pathlib import Path

import kvpop_compile as kc
from kvpop_compile.embedded import load_embedded_model
from kvpop_compile.embedded.recall import RecallItem
from kvpop_compile.evaluation.data import SEQUENCE_LENGTH
from kvpop_compile.evaluation.recall.protocol import (
    answer_exactly,
    answer_probability,
    decode_stretch,
)
from kvpop_compile.training.selection import (
    SELECTION_FAMILIES,
    CandidateSelection,
    recall_selection_items,
)

from .folders import with_tensors

SELECT_BATCH = 16  # items answered together, at most
# What a candidate is measured by, per item: its exact greedy answer (1 or 0), or the probability
# it gives the exact answer (exact match's smooth counterpart, which ranks candidates that answer
# the same number of items).
SELECT_MEASURES = {"exact": answer_exactly, "probability": answer_probability}
# The decode protocol's items: as long as the benchmark's decode rows, so that the model's own
# continuation fills the other half of the training sequence's 2048 positions before the question.
DECODE_LENGTH = 1024


def selection_items(split: str, per_task: int, seed: int) -> list[list[RecallItem]]:
    """The selection measure's items: ``per_task`` 2048-byte recall items per family group
    (:data:`~kvpop_compile.training.selection.SELECTION_FAMILIES`) and task of ``split``
    ("validation" or "train"), drawn with ``seed``; one list per family group and task."""
    return recall_selection_items(split, per_task, seed, SEQUENCE_LENGTH)


def decode_selection_items(split: str, per_task: int, seed: int) -> list[list[RecallItem]]:
    """As :func:`selection_items`, but items of :data:`DECODE_LENGTH` bytes, asked in the decode
    protocol."""
    return recall_selection_items(split, per_task, seed, DECODE_LENGTH)


def recall_values(model, groups, per_item, decode_groups=()) -> list[float]:
    """``per_item``'s value (:data:`SELECT_MEASURES`) for each item of ``groups``, asked in the
    prefill protocol, then for each item of ``decode_groups``, asked in the decode protocol (the
    model's own continuation filling its positions to twice the item's length, as in the
    benchmark), in that order."""
    values = [v for items in groups for v in per_item(model, items, "prefill", batch=SELECT_BATCH)]
    positions = model.config.max_position_embeddings
    for items in decode_groups:
        stretch = decode_stretch(items[0].context_length, positions)
        values += per_item(model, items, "decode", stretch, batch=SELECT_BATCH)
    return values


def recall_selection(
    model_path,
    config: kc.KVpopConfig,
    groups: list[list[RecallItem]],
    measure: str = "exact",
    decode_groups: list[list[RecallItem]] = (),
):
    """A ``select`` measure for :func:`kvpop_compile.train_scorer`: the mean over the items of
    ``groups`` (:func:`selection_items`, prefill protocol) and of ``decode_groups``
    (:func:`decode_selection_items`, decode protocol) of :data:`SELECT_MEASURES` ``[measure]``
    (the share answered exactly, or the mean probability of the exact answer) for a candidate
    scorer loaded into the model transformed with ``config``."""
    per_item = SELECT_MEASURES[measure]

    @functools.cache  # made at the first measure: a resumed, finished run measures nothing
    def transformed():
        return kc.transform(load_embedded_model(path=model_path), config)

    def select(folder: Path) -> float:
        values = recall_values(with_tensors(transformed(), folder), groups, per_item, decode_groups)
        return sum(values) / len(values)

    return select


def selection_spec(args) -> dict | None:
    """The run's selection measure: its split, family groups, items per family group and task,
    and seed, and its per-item measure, where it measures and its protocols when not the
    defaults (exact, at the training budget, prefill: what a record without them, written
    before they existed, measured).
    None: no selection. A record without family groups measured items that had none, so a run
    recorded with one is not resumed with the other."""
    if not args.select_items:
        return None
    spec = {
        "split": args.select_split, "families": list(SELECTION_FAMILIES),
        "items_per_task": args.select_items, "seed": args.select_seed,
    }  # fmt: skip
    if args.select_measure != "exact":
        spec["measure"] = args.select_measure
    if args.select_at != "training":
        spec["at"] = args.select_at
    if "decode" in args.select_protocols:
        spec["protocols"] = list(dict.fromkeys(args.select_protocols))  # each once, in order
        spec["decode_length"] = DECODE_LENGTH
    return spec


def reselect(select, key: tuple, report, selection: dict, run: dict, cache: dict):
    """Choose again, with ``select``, among the candidates the finished run in ``key[0]`` (its
    work folder) saved (``report``: its training report; ``run``: its run record). Returns the
    kept candidate's folder and ``selection`` with the new measures, what measuring took, and
    what the run had measured and kept (``during_training``). Capacities trained at one capacity
    share a work folder, and measured at the training budget they share a measure, so ``cache``
    (``key``: work folder and the budget measured at -> its measured candidates, minutes)
    measures each once."""
    if key not in cache:
        start = time.perf_counter()
        candidates = CandidateSelection(select, key[0])
        candidates.measure_saved([m["step"] for m in report.selections])
        cache[key] = candidates, round((time.perf_counter() - start) / 60, 2)
    candidates, minutes = cache[key]
    kept = candidates.best_step()
    during = {
        "command": run.get("command"), "selection": run.get("selection"),
        "measured": selection["measured"], "kept_step": selection["kept_step"],
    }  # fmt: skip
    return candidates.folder_of(kept), {
        **selection, "measured": candidates.measured, "kept_step": kept, "minutes": minutes,
        "during_training": during,
    }  # fmt: skip
