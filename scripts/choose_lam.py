"""Choose the recency term a saved scorer is used with, on validation text and recall items.

    python scripts/choose_lam.py kvpop_compile/embedded/scorers/memory-256 \\
        --lams 0 0.003 0.01

``KVpopConfig.lam`` adds ``lam * t`` to the priority of the token at position ``t``
(docs/design.md, §2): the newer of two tokens the scorer rates alike stays. It acts on
priorities, not on weights, so the same trained tensors can be used with any ``lam``. A scorer
without it keeps fewer of the recent tokens that ordinary text needs than a window does; too
much of it and the pool becomes a longer window, which loses what a later question asks about.
This measures the scorer in ``FOLDER`` at its own capacity and window with each of ``--lams``,
on two things the benchmarks never ask about:

* **text**: teacher-forced top-1 accuracy on ``--sequences`` windows of 2048 bytes of the
  standard library's test folder (one per file, ``evaluation.data.validation_sequences``), on
  all targets and on the long-range ones, beside the ``window`` policy (StreamingLLM) at the
  same capacity;
* **recall**: the mean probability of the exact answer (prefill protocol) on ``--items``
  validation recall items per family group and task, as ``choose_priority_span.py`` measures.

The rule, fixed before any measure: of the values whose text accuracy is at least
``window``'s on all targets and on long-range targets, the one with the highest recall measure
(the saved value stays unless another beats it by more than ``choose_priority_span.TIE``); where
none reaches ``window``, the one closest to it (the highest of the two differences' minimum).
``--lams`` must include the saved value. ``FOLDER`` is rewritten in one swap with the kept
``lam`` (tensors unchanged) and a ``lam_selection`` record in ``training.json`` of every measure;
an earlier record moves under ``replaces``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from choose_priority_span import TIE, rewrite  # noqa: E402
from train_embedded_scorers import (  # noqa: E402
    TRAINING_RECORD,
    recall_selection,
    selection_items,
)

import kvpop_compile as kc  # noqa: E402
from kvpop_compile.embedded import load_embedded_model  # noqa: E402
from kvpop_compile.evaluation.data import validation_sequences  # noqa: E402
from kvpop_compile.evaluation.fingerprints import items_sha256  # noqa: E402
from kvpop_compile.evaluation.long_range import long_range_targets  # noqa: E402
from kvpop_compile.evaluation.methods import WINDOW, budget_config  # noqa: E402
from kvpop_compile.evaluation.protocols import teacher_forced  # noqa: E402
from kvpop_compile.scorer_io import load_scorer, saved_config  # noqa: E402
from kvpop_compile.training.selection import SELECTION_FAMILIES  # noqa: E402

BATCH = 8  # sequences per forward


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path, help="a saved scorer folder (scorer.json and tensors)")
    p.add_argument("--lams", nargs="+", type=float, required=True, help="the values to measure")
    p.add_argument("--sequences", type=int, default=24, help="validation text windows")
    p.add_argument("--items", type=int, default=16, help="recall items per family group and task")
    p.add_argument("--seed", type=int, default=99, help="seed of the recall items")
    p.add_argument("--model", type=Path, help="model folder (default: the embedded model)")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    return p.parse_args(argv)


def check_lams(lams: list[float], saved: float) -> list[float]:
    """``lams`` as given; SystemExit naming a negative, non-finite or repeated value, or a list
    without the ``saved`` one (the one every other is measured against)."""
    listed = " ".join(f"{lam:g}" for lam in lams)
    for lam in lams:
        if not math.isfinite(lam) or lam < 0:
            raise SystemExit(f"--lams must be finite numbers >= 0, got {lam}")
    if len(set(lams)) != len(lams):
        raise SystemExit(f"--lams lists a value twice: {listed}")
    if saved not in lams:
        raise SystemExit(
            f"--lams {listed} leaves out {saved:g}, the lam the folder is saved with: include it"
        )
    return lams


def text_accuracy(model, ids: torch.Tensor, long_range: torch.Tensor) -> dict[str, float]:
    """Teacher-forced top-1 accuracy of ``model`` on ``ids (S, L + 1)``: over all targets and
    over the long-range ones (``long_range (S, L)`` bool)."""
    correct = torch.cat([teacher_forced(model, ids[i : i + BATCH]).correct for i in
                         range(0, ids.shape[0], BATCH)]).double()  # fmt: skip
    lr = long_range.double()
    return {"all": correct.mean().item(), "long_range": ((correct * lr).sum() / lr.sum()).item()}


def kept_lam(measured: dict[float, dict], saved: float) -> float:
    """The rule of the module docstring over ``measured`` (lam -> ``{"recall", "text_margin":
    {"all", "long_range"}}``, the margins over ``window``)."""
    bad = [lam for lam, m in measured.items() if not math.isfinite(m["recall"])]
    if bad:
        raise ValueError(f"non-finite recall measure at lam {bad}")
    worst = {lam: min(m["text_margin"].values()) for lam, m in measured.items()}
    eligible = [lam for lam in measured if worst[lam] >= 0]
    if not eligible:
        return max(measured, key=worst.__getitem__)
    best = max(eligible, key=lambda lam: measured[lam]["recall"])
    if saved in eligible and measured[best]["recall"] - measured[saved]["recall"] <= TIE:
        return saved
    return best


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    saved = saved_config(args.folder)
    lams = check_lams(args.lams, saved.lam)
    for name, value in (("--sequences", args.sequences), ("--items", args.items),
                        ("--threads", args.threads)):  # fmt: skip
        if value < 1:
            raise SystemExit(f"{name} must be 1 or more, got {value}")
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    sequences = validation_sequences(args.sequences, per_file=1)
    ids = torch.stack([s.ids for s in sequences])
    long_range = torch.stack([long_range_targets(s.ids, WINDOW) for s in sequences])[:, 1:]
    groups = selection_items("validation", args.items, args.seed)
    capacity = saved.sinks + saved.window + saved.topk
    model = load_embedded_model(path=args.model)
    window = text_accuracy(kc.transform(model, budget_config("window", capacity)), ids, long_range)
    print(f"window @ capacity {capacity}: text {window}", flush=True)
    measured = {}
    for lam in lams:
        config = dataclasses.replace(saved, lam=lam)
        scored = load_scorer(
            kc.transform(load_embedded_model(path=args.model), config), args.folder
        )
        text = text_accuracy(scored, ids, long_range)
        recall = recall_selection(args.model, config, groups, "probability")(args.folder)
        measured[lam] = {"recall": recall, "text": text,
                         "text_margin": {k: text[k] - window[k] for k in text}}  # fmt: skip
        print(f"{args.folder}: lam {lam:g}: {measured[lam]}", flush=True)
    kept = kept_lam(measured, saved.lam)
    training_file = args.folder / TRAINING_RECORD
    record = json.loads(training_file.read_text()) if training_file.is_file() else {}
    earlier = record.pop("lam_selection", None)
    record["lam_selection"] = {
        "command": " ".join(["python scripts/choose_lam.py", *argv]),
        "text": {"sequences": [s.source for s in sequences], "protocol": "teacher_forced",
                 "window_policy": window},
        "recall": {"split": "validation", "families": list(SELECTION_FAMILIES),
                   "items_per_task": args.items, "seed": args.seed, "measure": "probability",
                   "protocol": "prefill",
                   "items_sha256": items_sha256(i for group in groups for i in group)},
        "python": platform.python_version(),
        "measured": [{"lam": lam, **m} for lam, m in measured.items()],
        "saved_before": saved.lam, "kept": kept,
        "minutes": round((time.perf_counter() - start) / 60, 2),
        **({"replaces": earlier} if earlier else {}),
    }  # fmt: skip
    rewrite(args.folder, dataclasses.replace(saved, lam=kept), record, args.model)
    print(f"{args.folder}: kept lam {kept:g} (saved before: {saved.lam:g})")


if __name__ == "__main__":
    main()
