"""Choose the priority span a saved scorer is used with, by recall items it was never chosen on.

    python scripts/choose_priority_span.py runs/memory-256 --spans 6 8 10 12 16

(a scorer of one budget, as training writes it).

``KVpopConfig.priority_span`` raises each token's score to the highest among itself and the
``P`` tokens that left the window just before it (docs/design.md, §2). It acts on scores, not on
weights, so the same trained tensors can be used with any span, and the best span depends on the
budget: a wider span keeps more of each line the scorer rated, a narrower one leaves pool slots
for more lines. This measures the scorer in ``FOLDER`` at its own capacity and window with each of
``--spans``, by the mean probability of the exact answer (prefill protocol; the smooth
counterpart of exact match, ``evaluation/recall/protocol.answer_probability``) on ``--items``
recall items per family group and task of ``--split`` (``validation`` by default: the standard
library's test folder, code the model never saw and no benchmark asks about; never held-out
code), in the trained families and the validation ones
(``training/selection.SELECTION_FAMILIES``; never the held-out families the benchmark's rows
ask), drawn with ``--seed``.

``--spans`` must include the span the folder is saved with, so that every other is measured
against it. The highest mean wins, except that the saved span stays unless another beats it by
more than :data:`TIE` (a lead inside that is a tie). ``FOLDER`` is then rewritten in one swap:
its ``scorer.json`` saved with the kept span (the tensors, and their SHA-256, unchanged; any other
file copied as it is) and its ``training.json`` (created if absent) given a
``priority_span_selection`` record of every measure, the kept span, the items' SHA-256 and the
Python version (the test folder differs between releases); a record from an earlier choice moves
under ``replaces``. The record's own ``priority_span`` stays the span the scorer was trained with.
The shipped ``memory`` scorers were chosen with the command above, for ``memory-512`` and
``memory-256``, each with ``--threads 1``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import platform
import shutil
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # embedded_scorers

from embedded_scorers.candidates import recall_selection, selection_items  # noqa: E402
from embedded_scorers.folders import TRAINING_RECORD, write_scorer  # noqa: E402

import kvpop_compile as kc  # noqa: E402
from kvpop_compile.atomic import replace_folder  # noqa: E402
from kvpop_compile.embedded import load_embedded_model  # noqa: E402
from kvpop_compile.fingerprints import items_sha256  # noqa: E402
from kvpop_compile.scorer_io import saved_config, tensors_sha256  # noqa: E402
from kvpop_compile.training.selection import SELECTION_FAMILIES, SELECTION_SPLITS  # noqa: E402

TIE = 1e-4  # a lead of at most this over the saved span's mean is a tie: the saved span stays


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path, help="a saved scorer folder (scorer.json and tensors)")
    p.add_argument("--spans", nargs="+", type=int, required=True, help="the spans to measure")
    p.add_argument("--split", default="validation", choices=SELECTION_SPLITS)
    p.add_argument("--items", type=int, default=64, help="recall items per family group and task")
    p.add_argument("--seed", type=int, default=99, help="seed of the items")
    p.add_argument("--model", type=Path, help="model folder (default: the embedded model)")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    return p.parse_args(argv)


def check_listed(flag: str, values: list, saved, allowed, rule: str, noun: str, show=str) -> list:
    """``values`` as given for ``flag``; SystemExit naming a value that ``allowed`` refuses (the
    message says it must be ``rule``), a repeated one, or a list without the ``saved`` value
    (the one every other must beat). ``show`` writes a value in the messages."""
    listed = " ".join(map(show, values))
    for value in values:
        if not allowed(value):
            raise SystemExit(f"{flag} must be {rule}, got {show(value)}")
    if len(set(values)) != len(values):
        raise SystemExit(f"{flag} lists a {noun} twice: {listed}")
    if saved not in values:
        raise SystemExit(
            f"{flag} {listed} leaves out {show(saved)}, the {noun} the folder is saved with: "
            "include it, so that the others are measured against it"
        )
    return values


def check_spans(spans: list[int], saved: int) -> list[int]:
    """``spans`` as given (:func:`check_listed`: integers >= 0, with the ``saved`` span)."""
    return check_listed("--spans", spans, saved, lambda span: span >= 0, "integers >= 0", "span")


def kept_span(measured: dict[int, float], saved: int) -> int:
    """The span of the highest mean in ``measured`` (span -> mean), unless it leads the
    ``saved`` span's mean by :data:`TIE` or less: then ``saved``. A non-finite mean is refused,
    since it would compare as neither higher nor lower."""
    bad = {span: value for span, value in measured.items() if not math.isfinite(value)}
    if bad:
        raise ValueError(f"non-finite mean answer probability at priority_span {bad}")
    best = max(measured, key=measured.__getitem__)
    return saved if measured[best] - measured[saved] <= TIE else best


def one_budget(folder: Path, script: str) -> kc.KVpopConfig:
    """The config ``folder``'s scorer was saved with; ``SystemExit`` naming ``script`` when it
    keeps a per-layer budget: these choices are made on a scorer of one budget, before
    ``choose_layer_budgets.py`` shares its memory between the layers."""
    saved = saved_config(folder)
    if saved.per_layer is not None:
        raise SystemExit(
            f"{folder} keeps a per-layer budget {list(saved.capacities)}: {script} measures a "
            "scorer of one budget (its one budget is the first entry measured in training.json's "
            "layer_budget_selection)"
        )
    return saved


def rewrite(folder: Path, config: kc.KVpopConfig, record: dict, model_path) -> None:
    """Replace ``folder`` by the same tensors saved for ``config`` and ``record`` as its
    training record, in one swap (a reader sees the old folder or the new, never half)."""

    before = tensors_sha256(folder)

    def build(staging: Path) -> None:
        write_scorer(staging, folder, record, load_embedded_model(path=model_path), config)
        after = tensors_sha256(staging)
        if after != before:  # checked before the swap: the old folder stays if this fails
            raise RuntimeError(f"{folder}: tensors changed on saving ({before} -> {after})")
        for other in folder.iterdir():  # anything else a user keeps there goes along
            if not (staging / other.name).exists():
                copy = shutil.copytree if other.is_dir() else shutil.copy2
                copy(other, staging / other.name)

    replace_folder(folder, build)


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    saved = one_budget(args.folder, "choose_priority_span.py")
    spans = check_spans(args.spans, saved.priority_span)
    for name, value in (("--items", args.items), ("--threads", args.threads)):
        if value < 1:
            raise SystemExit(f"{name} must be 1 or more, got {value}")
    torch.set_num_threads(args.threads)
    groups = selection_items(args.split, args.items, args.seed)
    start = time.perf_counter()
    measured = {}
    for span in spans:
        config = dataclasses.replace(saved, priority_span=span)
        measured[span] = recall_selection(args.model, config, groups, "probability")(args.folder)
        print(f"{args.folder}: priority_span {span}: {measured[span]:.4f}", flush=True)
    kept = kept_span(measured, saved.priority_span)
    training_file = args.folder / TRAINING_RECORD
    record = json.loads(training_file.read_text()) if training_file.is_file() else {}
    earlier = record.pop("priority_span_selection", None)
    record["priority_span_selection"] = {
        "command": " ".join(["python scripts/choose_priority_span.py", *argv]),
        "split": args.split, "families": list(SELECTION_FAMILIES),
        "items_per_task": args.items, "seed": args.seed,
        "measure": "probability", "protocol": "prefill",
        "items_sha256": items_sha256(i for group in groups for i in group),
        "python": platform.python_version(),
        "measured": [{"priority_span": s, "select": v} for s, v in measured.items()],
        "saved_before": saved.priority_span, "kept": kept,
        "minutes": round((time.perf_counter() - start) / 60, 2),
        **({"replaces": earlier} if earlier else {}),
    }  # fmt: skip
    rewrite(args.folder, dataclasses.replace(saved, priority_span=kept), record, args.model)
    print(f"{args.folder}: kept priority_span {kept} (saved before: {saved.priority_span})")


if __name__ == "__main__":
    main()
