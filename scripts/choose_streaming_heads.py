"""Choose a saved scorer's streaming heads: the KV heads that keep the most recent tokens.

    python scripts/choose_streaming_heads.py runs/memory-256 --window 96 --lam 1e-6

One window for every head splits each head's capacity the same way between the most recent
tokens, which ordinary text needs, and a pool of older tokens the scorer rates high, which a
question about a line far back needs (``choose_recency.py`` chooses that one split). A streaming
head (:mod:`kvpop_compile.streaming_heads`) has a scorer output of 0, so with ``lam > 0`` its pool
keeps the newest tokens and the head holds the ``capacity - sinks`` most recent ones; the other
heads keep the narrow ``--window`` and a wide learned pool. This measures, at the scorer's own
capacity with ``--window`` and ``--lam``, the two measures of ``choose_recency.py`` (validation
text beside the ``window`` policy at the same capacity, all targets and long-range ones; the
mean probability of the exact answer on validation recall items in the trained and validation
families) for these sets of streaming heads:

1. none, and each ``(layer, kv_head)`` alone;
2. the first ``k`` heads, for every ``k`` from 2 to all of them, in the order of the recall
   measure with that head alone streaming, highest first (the heads recall needs least come
   first; ties: the higher text margin, then the lower layer and head).

With every head streaming the cache keeps what the ``window`` policy keeps, so the text margin of
that set is 0 (the run checks it); it is measured, not a candidate: it is no scorer. The folder's
saved configuration (its window and ``lam``, no streaming head) is measured too and is a
candidate. The rule, fixed before any measure: of the candidates whose text accuracy is at
least ``window``'s on all targets and on long-range targets, the one with the highest recall
measure (the saved configuration on a tie); where none is, the saved configuration. ``FOLDER``
is rewritten in one swap with the kept configuration (for a set of streaming heads:
``--window``, the pool of the rest of the capacity, ``--lam`` and those heads' readouts zeroed;
otherwise as it was) and a ``streaming_selection`` record in ``training.json`` of every measure;
an earlier ``recency_selection`` moves under ``replaces``. A folder that already has streaming
heads is refused: measure the scorer as it was trained.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import shutil
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from choose_priority_span import one_budget, rewrite  # noqa: E402
from choose_recency import (  # noqa: E402
    data_record,
    split_config,
    text_accuracy,
    validation_data,
    validation_measure,
)
from embedded_scorers.candidates import SELECT_MEASURES  # noqa: E402
from embedded_scorers.folders import TRAINING_RECORD, with_tensors  # noqa: E402

import kvpop_compile as kc  # noqa: E402
from kvpop_compile.atomic import replace_folder  # noqa: E402
from kvpop_compile.embedded import load_embedded_model  # noqa: E402
from kvpop_compile.scorer_io import saved_shape  # noqa: E402
from kvpop_compile.streaming_heads import (  # noqa: E402
    make_streaming_heads,
    require_recency,
    streaming_heads,
)

RECORD = "streaming_selection"
EARLIER_RECORDS = (RECORD, "recency_selection")
Heads = tuple[tuple[int, int], ...]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path, help="a saved scorer folder (scorer.json and tensors)")
    p.add_argument(
        "--window",
        type=int,
        required=True,
        help="the window of every head (streaming heads keep the rest too)",
    )
    p.add_argument(
        "--lam",
        type=float,
        default=1e-6,
        help="the recency term, > 0: it orders a streaming head's pool (default 1e-6)",
    )
    p.add_argument("--sequences", type=int, default=24, help="validation text windows")
    p.add_argument("--items", type=int, default=16, help="recall items per family group and task")
    p.add_argument("--seed", type=int, default=99, help="seed of the recall items")
    p.add_argument("--model", type=Path, help="model folder (default: the embedded model)")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    return p.parse_args(argv)


def check_args(args, saved: kc.KVpopConfig) -> None:
    """Exit naming the first bad argument: ``--window`` must leave the pool a slot at the
    saved capacity, ``--lam`` must order positions in float32, counts must be 1 or more."""
    widest = saved.capacity - saved.sinks - 1
    if not 1 <= args.window <= widest:
        raise SystemExit(f"--window must be from 1 to {widest} (capacity {saved.capacity} less "
                         f"{saved.sinks} sinks and one pool slot), got {args.window}")  # fmt: skip
    try:
        require_recency(args.lam, "--lam: streaming heads need")
    except ValueError as error:
        raise SystemExit(str(error)) from None
    for name, value in (("--sequences", args.sequences), ("--items", args.items),
                        ("--threads", args.threads)):  # fmt: skip
        if value < 1:
            raise SystemExit(f"{name} must be 1 or more, got {value}")


def window_policy(saved: kc.KVpopConfig) -> kc.KVpopConfig:
    """The ``window`` policy at ``saved``'s sinks and capacity: the sinks and the newest rest."""
    return kc.KVpopConfig(sinks=saved.sinks, window=1, topk=saved.capacity - saved.sinks - 1,
                          scorer="window")  # fmt: skip


def prefix_order(singles: dict[Heads, dict]) -> list[tuple[int, int]]:
    """The heads by the recall measure with each alone streaming, highest first (ties: the
    higher worse-of-two text margin, then the lower ``(layer, kv_head)``)."""

    def key(heads: Heads):
        m = singles[heads]
        return (-m["recall"], -min(m["text_margin"].values()), heads[0])

    return [heads[0] for heads in sorted(singles, key=key)]


def kept_heads(measured: dict[Heads, dict], saved: dict) -> Heads | None:
    """The rule of the module docstring over ``measured`` (heads -> ``{"recall", "text_margin":
    {"all", "long_range"}}``, every head's set left out by the caller) and the ``saved``
    configuration's measure: the kept heads, or ``None`` for the saved configuration; of equal
    recall the saved one, then the first measured."""
    bad = [heads for heads, m in measured.items() if not math.isfinite(m["recall"])]
    if bad or not math.isfinite(saved["recall"]):
        raise ValueError(f"non-finite recall measure with streaming heads {bad or 'saved'}")

    def eligible(m: dict) -> bool:
        return min(m["text_margin"].values()) >= 0

    best = max((heads for heads, m in measured.items() if eligible(m)),
               key=lambda heads: measured[heads]["recall"], default=None)  # fmt: skip
    if best is None or (eligible(saved) and saved["recall"] >= measured[best]["recall"]):
        return None
    return best


def main(argv=None) -> None:
    """Measure, choose and rewrite the folder (module docstring)."""
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    saved = one_budget(args.folder, "choose_streaming_heads.py")
    check_args(args, saved)
    shape = saved_shape(args.folder)
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    config = split_config(saved, args.window, args.lam)
    model = with_tensors(kc.transform(load_embedded_model(path=args.model), config), args.folder)
    already = streaming_heads(model)
    if already:
        raise SystemExit(f"{args.folder} already has streaming heads {already}: choose them on "
                         "the scorer as it was trained")  # fmt: skip
    sequences, ids, long_range, groups = validation_data(args.sequences, args.items, args.seed)
    baseline = kc.transform(load_embedded_model(path=args.model), window_policy(saved))
    window_text = text_accuracy(baseline, ids, long_range)
    print(f"window @ capacity {saved.capacity}: text {window_text}", flush=True)
    per_item = SELECT_MEASURES["probability"]

    def measure_model(scored, what: str) -> dict:
        text = text_accuracy(scored, ids, long_range)
        result = validation_measure(scored, text, per_item, groups, window_text)
        result.pop("recall_items")  # its rule compares the means, which its record keeps
        print(f"{args.folder}: {what}: {result}", flush=True)
        return result

    def measure(heads: Heads) -> dict:
        # Fresh tensors each time: the zeroed readouts of the last set must not carry over.
        make_streaming_heads(with_tensors(model, args.folder), heads)
        return measure_model(model, f"streaming heads {list(heads)}")

    saved_model = with_tensors(kc.transform(load_embedded_model(path=args.model), saved),
                               args.folder)  # fmt: skip
    saved_measure = measure_model(saved_model, f"saved window {saved.window}, lam {saved.lam:g}")
    all_heads = tuple((layer, head) for layer in range(shape["num_layers"])
                      for head in range(shape["num_kv_heads"]))  # fmt: skip
    measured = {(): measure(())}
    singles = {(head,): measure((head,)) for head in all_heads}
    measured.update(singles)
    order = prefix_order(singles)
    for k in range(2, len(order) + 1):
        heads = tuple(sorted(order[:k]))
        measured[heads] = measure(heads)
    every = measured[all_heads]
    if any(abs(margin) > 1e-9 for margin in every["text_margin"].values()):
        raise RuntimeError(f"every head streaming should keep what the window policy keeps, but "
                           f"the text margins are {every['text_margin']}")  # fmt: skip
    kept = kept_heads({h: m for h, m in measured.items() if h != all_heads}, saved_measure)
    training_file = args.folder / TRAINING_RECORD
    record = json.loads(training_file.read_text()) if training_file.is_file() else {}
    earlier = {name: record.pop(name) for name in EARLIER_RECORDS if name in record}
    record[RECORD] = {
        "command": " ".join(["python scripts/choose_streaming_heads.py", *argv]),
        "capacity": saved.capacity, "window": args.window, "lam": args.lam,
        **data_record(sequences, window_text, groups, args.items, args.seed),
        "order": [list(head) for head in order],
        "python": platform.python_version(),
        "saved": {"window": saved.window, "lam": saved.lam, **saved_measure},
        "measured": [{"streaming_heads": [list(h) for h in heads], **m}
                     for heads, m in measured.items()],
        "kept": None if kept is None else [list(head) for head in kept],
        "minutes": round((time.perf_counter() - start) / 60, 2),
        **({"replaces": earlier} if earlier else {}),
    }  # fmt: skip
    if kept is None:
        rewrite(args.folder, saved, record, args.model)
        print(f"{args.folder}: kept the saved window {saved.window} and lam {saved.lam:g}, no "
              "streaming heads")  # fmt: skip
        return
    make_streaming_heads(with_tensors(model, args.folder), kept)

    def build(staging: Path) -> None:
        kc.save_scorer(model, staging)
        (staging / TRAINING_RECORD).write_text(json.dumps(record, indent=1) + "\n")
        for other in args.folder.iterdir():  # anything else a user keeps there goes along
            if not (staging / other.name).exists():
                copy = shutil.copytree if other.is_dir() else shutil.copy2
                copy(other, staging / other.name)

    replace_folder(args.folder, build)
    print(f"{args.folder}: kept streaming heads {list(kept)} at window {args.window}, "
          f"lam {args.lam:g}")  # fmt: skip


if __name__ == "__main__":
    main()
