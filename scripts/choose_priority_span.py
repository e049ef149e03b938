"""Choose the priority span a saved scorer is used with, by recall items it was never chosen on.

    python scripts/choose_priority_span.py kvpop_compile/embedded/scorers/memory-256 \\
        --spans 6 8 10 12 16

``KVpopConfig.priority_span`` raises each token's score to the highest among itself and the
``P`` tokens that left the window just before it (docs/design.md, §2). It acts on scores, not on
weights, so the same trained tensors can be used with any span, and the best span depends on the
budget: a wider span keeps more of each line the scorer rated, a narrower one leaves pool slots
for more lines. This measures the scorer in ``FOLDER`` at its own capacity and window with each of
``--spans``, by the mean probability of the exact answer (prefill protocol; the smooth
counterpart of exact match, ``evaluation/recall.answer_probability``) on ``--items`` recall items
per task of ``--split`` (``validation`` by default: the standard library's test folder, code the
model never saw and no benchmark asks about; never held-out items), drawn with ``--seed``.

The highest mean wins. Means equal to 4 decimal places count as a tie, which keeps the span the
folder is saved with (then the smallest span). ``FOLDER`` is then rewritten in one swap: its
``scorer.json`` saved with the kept span (the tensors, and their SHA-256, unchanged) and its
``training.json`` (created if absent) given a ``priority_span_selection`` record of every
measure, the items' SHA-256 and the Python version (the test folder differs between releases).
The shipped ``memory`` scorers were chosen with the command above, for ``memory-512`` and
``memory-256``, each with ``--threads 1``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # train_embedded_scorers

from train_embedded_scorers import recall_selection, selection_items, with_tensors  # noqa: E402

import kvpop_compile as kc  # noqa: E402
from kvpop_compile.atomic import replace_folder  # noqa: E402
from kvpop_compile.embedded import load_embedded_model  # noqa: E402
from kvpop_compile.evaluation.fingerprints import items_sha256  # noqa: E402
from kvpop_compile.scorer_io import saved_config, tensors_sha256  # noqa: E402

TRAINING_RECORD = "training.json"
TIE_PLACES = 4  # means that agree to this many decimals are a tie: the saved span stays


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path, help="a saved scorer folder (scorer.json and tensors)")
    p.add_argument("--spans", nargs="+", type=int, required=True, help="the spans to measure")
    p.add_argument("--split", default="validation", choices=["validation", "train"])
    p.add_argument("--items", type=int, default=64, help="recall items per task")
    p.add_argument("--seed", type=int, default=99, help="seed of the items")
    p.add_argument("--model", type=Path, help="model folder (default: the embedded model)")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    return p.parse_args(argv)


def check_spans(spans: list[int]) -> list[int]:
    """``spans`` without repeats, in the order given; SystemExit naming a bad one."""
    for span in spans:
        if span < 0:
            raise SystemExit(f"--spans must be integers >= 0, got {span}")
    if len(set(spans)) != len(spans):
        raise SystemExit(f"--spans lists a span twice: {' '.join(map(str, spans))}")
    return spans


def kept_span(measured: dict[int, float], saved: int) -> int:
    """The span with the highest mean to :data:`TIE_PLACES` decimals; on a tie the ``saved``
    span if it is among the best, else the smallest of them."""
    best = max(round(value, TIE_PLACES) for value in measured.values())
    tied = [span for span, value in measured.items() if round(value, TIE_PLACES) == best]
    return saved if saved in tied else min(tied)


def rewrite(folder: Path, config: kc.KVpopConfig, record: dict, model_path) -> None:
    """Replace ``folder`` by the same tensors saved for ``config`` and ``record`` as its
    training record, in one swap (a reader sees the old folder or the new, never half)."""

    def build(staging: Path) -> None:
        model = kc.transform(load_embedded_model(path=model_path), config)
        kc.save_scorer(with_tensors(model, folder), staging)
        (staging / TRAINING_RECORD).write_text(json.dumps(record, indent=1) + "\n")

    before = tensors_sha256(folder)
    replace_folder(folder, build)
    after = tensors_sha256(folder)
    if after != before:  # the same tensors must serialise to the same bytes
        raise RuntimeError(f"{folder}: tensors changed on saving ({before} -> {after})")


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    spans = check_spans(args.spans)
    if args.items < 1:
        raise SystemExit(f"--items must be 1 or more, got {args.items}")
    torch.set_num_threads(args.threads)
    saved = saved_config(args.folder)
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
    record["priority_span_selection"] = {
        "command": " ".join(["python scripts/choose_priority_span.py", *argv]),
        "split": args.split, "items_per_task": args.items, "seed": args.seed,
        "measure": "probability", "protocol": "prefill",
        "items_sha256": items_sha256(i for group in groups for i in group),
        "python": platform.python_version(),
        "measured": [{"priority_span": s, "select": v} for s, v in measured.items()],
        "saved_before": saved.priority_span, "kept": kept,
        "minutes": round((time.perf_counter() - start) / 60, 2),
    }  # fmt: skip
    rewrite(args.folder, dataclasses.replace(saved, priority_span=kept), record, args.model)
    print(f"{args.folder}: kept priority_span {kept} (saved before: {saved.priority_span})")


if __name__ == "__main__":
    main()
