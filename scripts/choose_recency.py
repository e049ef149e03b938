"""Choose how much of a saved scorer's budget goes to recency: its window and its recency term.

    python scripts/choose_recency.py runs/memory-256 \\
        --windows 96 128 160 192 --lams 0 0.0005 0.001

``FOLDER`` is a scorer of one budget, as training writes it (the shipped folders were chosen so
before their memory was shared between the layers by ``choose_layer_budgets.py``).

A bounded cache keeps ``sinks + window + topk`` tokens: the ``window`` most recent always, and a
pool of the ``topk`` older tokens of highest priority, where ``KVpopConfig.lam`` adds
``lam * t`` to the priority of the token at position ``t`` (docs/design.md, §2). Both act on
which tokens are kept, not on the scorer's weights, so the same trained tensors run with any
split of one capacity into window and pool and with any ``lam``. Ordinary text needs recent
tokens, which a wider window or a recency term keeps; a question about a line far back needs a
pool that keeps old lines the scorer rates high, which both take slots from. This measures the
scorer in ``FOLDER`` at its own capacity with each pair of ``--windows`` and ``--lams`` on two
things the benchmarks never ask about:

* **text**: teacher-forced top-1 accuracy on ``--sequences`` windows of 2048 bytes of the
  standard library's test folder (one per file, ``evaluation.data.validation_sequences``), on
  all targets and on the long-range ones, beside the ``window`` policy (StreamingLLM) at the
  same capacity;
* **recall**: the mean probability of the exact answer (prefill protocol) on ``--items``
  validation recall items per family group and task, as ``choose_priority_span.py`` measures.

The rule, fixed before any measure: of the pairs whose text accuracy is at least ``window``'s on
all targets and on long-range targets, the one with the highest recall measure (the saved pair
stays unless another beats it by more than ``choose_priority_span.TIE``); where none reaches
``window``, the one closest to it (the highest of the two differences' minimum). ``--windows``
and ``--lams`` must include the saved values, and each window must leave the pool a slot.
``FOLDER`` is rewritten in one swap with the kept window, pool and ``lam`` (tensors unchanged)
and a ``recency_selection`` record in ``training.json`` of every measure; an earlier record
(or one of the ``lam`` alone, ``lam_selection``) moves under ``replaces``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from choose_priority_span import TIE, check_listed, one_budget, rewrite  # noqa: E402
from embedded_scorers.candidates import (  # noqa: E402
    DECODE_LENGTH,
    recall_selection,
    recall_values,
    selection_items,
)
from embedded_scorers.folders import TRAINING_RECORD, with_tensors  # noqa: E402

import kvpop_compile as kc  # noqa: E402
from kvpop_compile.embedded import load_embedded_model  # noqa: E402
from kvpop_compile.evaluation.data import validation_sequences  # noqa: E402
from kvpop_compile.evaluation.methods import WINDOW, budget_config  # noqa: E402
from kvpop_compile.evaluation.protocols import teacher_forced  # noqa: E402
from kvpop_compile.evaluation.quality.long_range import long_range_targets  # noqa: E402
from kvpop_compile.fingerprints import items_sha256  # noqa: E402
from kvpop_compile.training.selection import SELECTION_FAMILIES  # noqa: E402

BATCH = 8  # sequences per forward
RECORD = "recency_selection"
EARLIER_RECORDS = (RECORD, "lam_selection")  # "lam_selection": the lam chosen alone


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path, help="a saved scorer folder (scorer.json and tensors)")
    p.add_argument("--windows", nargs="+", type=int, help="windows to measure (default: saved)")
    p.add_argument("--lams", nargs="+", type=float, help="lams to measure (default: saved)")
    p.add_argument("--sequences", type=int, default=24, help="validation text windows")
    p.add_argument("--items", type=int, default=16, help="recall items per family group and task")
    p.add_argument("--seed", type=int, default=99, help="seed of the recall items")
    p.add_argument("--model", type=Path, help="model folder (default: the embedded model)")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    return p.parse_args(argv)


def check_lams(lams: list[float], saved: float) -> list[float]:
    """``lams`` as given (:func:`check_listed`: finite numbers >= 0, with the ``saved`` one)."""
    return check_listed("--lams", lams, saved, lambda lam: math.isfinite(lam) and lam >= 0,
                        "finite numbers >= 0", "lam", show=show_lam)  # fmt: skip


def show_lam(lam: float) -> str:
    """``lam`` written short (``0.0005``, ``0``) where that reads back as the same number, in
    full otherwise, so that a message never names two different lams alike."""
    short = f"{lam:g}"
    return short if float(short) == lam else repr(lam)


def check_windows(windows: list[int], saved: kc.KVpopConfig) -> list[int]:
    """``windows`` as given (:func:`check_listed`: each from 1 to what leaves the pool one slot
    at the saved capacity, with the saved window)."""
    widest = saved.capacity - saved.sinks - 1
    rule = (f"from 1 to {widest} (capacity {saved.capacity} less {saved.sinks} sinks and one pool "
            "slot)")  # fmt: skip
    return check_listed("--windows", windows, saved.window, lambda w: 1 <= w <= widest, rule,
                        "window")  # fmt: skip


def split_config(saved: kc.KVpopConfig, window: int, lam: float) -> kc.KVpopConfig:
    """``saved`` at its own capacity with ``window`` recent slots, the rest pool, and ``lam``."""
    topk = saved.capacity - saved.sinks - window
    return dataclasses.replace(saved, window=window, topk=topk, lam=lam)


def text_accuracy(model, ids: torch.Tensor, long_range: torch.Tensor) -> dict[str, float]:
    """Teacher-forced top-1 accuracy of ``model`` on ``ids (S, L + 1)``: over all targets and
    over the long-range ones (``long_range (S, L)`` bool)."""
    correct = torch.cat([teacher_forced(model, ids[i : i + BATCH]).correct for i in
                         range(0, ids.shape[0], BATCH)]).double()  # fmt: skip
    lr = long_range.double()
    return {"all": correct.mean().item(), "long_range": ((correct * lr).sum() / lr.sum()).item()}


def validation_measure(
    model, text: dict[str, float], per_item, groups, window_text, decode_groups=()
) -> dict:
    """The selection measures of a model: its ``text`` accuracies (:func:`text_accuracy`), their
    margins over ``window_text`` (the ``window`` policy's), and the recall measure, the mean of
    ``per_item`` (``SELECT_MEASURES["probability"]``: the probability of the exact answer) over
    the items of ``groups`` (prefill protocol) and of ``decode_groups`` (decode protocol), with
    the per-item values (``recall_items``, in that order) that :func:`lead_needed` pairs."""
    values = recall_values(model, groups, per_item, decode_groups)
    return {"recall": sum(values) / len(values), "recall_items": values, "text": text,
            "text_margin": {k: text[k] - window_text[k] for k in text}}  # fmt: skip


def validation_data(sequences: int, items: int, seed: int):
    """What both measures read: ``sequences`` validation text windows (one per file), their
    token ids ``(S, L + 1)`` and long-range targets ``(S, L)`` bool, and ``items`` validation
    recall items per family group and task drawn with ``seed`` (one list per group and task)."""
    windows = validation_sequences(sequences, per_file=1)
    ids = torch.stack([s.ids for s in windows])
    long_range = torch.stack([long_range_targets(s.ids, WINDOW) for s in windows])[:, 1:]
    return windows, ids, long_range, selection_items("validation", items, seed)


def data_record(
    sequences, window_text: dict, groups, items: int, seed: int, decode_groups=()
) -> dict:
    """The ``text`` and ``recall`` parts of a selection record: what was measured, and the
    ``window`` policy's text accuracy the margins are taken from; with ``decode_groups``, the
    ``decode`` part: the items asked in the decode protocol."""
    decode = {} if not decode_groups else {"decode": {
        "length": DECODE_LENGTH, "items_per_task": len(decode_groups[0]),
        "items_sha256": items_sha256(i for group in decode_groups for i in group),
    }}  # fmt: skip
    return {
        "text": {"sequences": [s.source for s in sequences], "protocol": "teacher_forced",
                 "window_policy": window_text},
        "recall": {"split": "validation", "families": list(SELECTION_FAMILIES),
                   "items_per_task": items, "seed": seed, "measure": "probability",
                   "protocol": "prefill",
                   "items_sha256": items_sha256(i for group in groups for i in group)},
        **decode,
    }  # fmt: skip


def lead_needed(best: dict, saved: dict) -> float:
    """How far ``best``'s recall measure must lead ``saved``'s to replace it: :data:`TIE`, or,
    where both hold per-item values (``recall_items``, the same items in the same order), twice
    the standard error of their paired differences if that is more. A lead inside the noise of
    the items measured is a tie: the saved setting stays."""
    if "recall_items" not in best or "recall_items" not in saved:
        return TIE
    pairs = list(zip(best["recall_items"], saved["recall_items"], strict=True))
    if len(pairs) < 2:
        return TIE
    spread = statistics.stdev(b - s for b, s in pairs)
    return max(TIE, 2 * spread / math.sqrt(len(pairs)))


def kept_setting(measured: dict[tuple, dict], saved: tuple) -> tuple:
    """The rule of the module docstring over ``measured`` (``(window, lam)`` -> ``{"recall",
    "text_margin": {"all", "long_range"}}``, the margins over ``window``; with
    ``"recall_items"``, the saved setting's lead to beat is :func:`lead_needed`'s), which must
    hold the ``saved`` setting: every other is measured against it."""
    if saved not in measured:
        raise ValueError(f"the saved setting {saved} was not measured: measure it with the others")
    worst = {key: min(m["text_margin"].values()) for key, m in measured.items()}
    best = best_eligible(measured)
    if best is None:
        return max(measured, key=worst.__getitem__)
    lead = measured[best]["recall"] - measured[saved]["recall"]
    if worst[saved] >= 0 and lead <= lead_needed(measured[best], measured[saved]):
        return saved
    return best


def best_eligible(measured: dict[tuple, dict]) -> tuple | None:
    """Of the settings in ``measured`` (as :func:`kept_setting` takes them) whose text margins
    are both 0 or more, the one with the highest recall measure; ``None`` where there is none.
    A non-finite recall measure is refused, since it would compare as neither higher nor
    lower."""
    bad = [key for key, m in measured.items() if not math.isfinite(m["recall"])]
    if bad:
        raise ValueError(f"non-finite recall measure at (window, lam) {bad}")
    eligible = [key for key, m in measured.items() if min(m["text_margin"].values()) >= 0]
    return max(eligible, key=lambda key: measured[key]["recall"], default=None)


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    saved = one_budget(args.folder, "choose_recency.py")
    windows = check_windows(args.windows or [saved.window], saved)
    lams = check_lams(args.lams or [saved.lam], saved.lam)
    for name, value in (("--sequences", args.sequences), ("--items", args.items),
                        ("--threads", args.threads)):  # fmt: skip
        if value < 1:
            raise SystemExit(f"{name} must be 1 or more, got {value}")
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    sequences, ids, long_range, groups = validation_data(args.sequences, args.items, args.seed)
    model = load_embedded_model(path=args.model)
    baseline = kc.transform(model, budget_config("window", saved.capacity))
    window_text = text_accuracy(baseline, ids, long_range)
    print(f"window @ capacity {saved.capacity}: text {window_text}", flush=True)
    measured = {}
    for window in windows:
        for lam in lams:
            config = split_config(saved, window, lam)
            scored = with_tensors(kc.transform(load_embedded_model(path=args.model), config),
                                  args.folder)  # fmt: skip
            text = text_accuracy(scored, ids, long_range)
            recall = recall_selection(args.model, config, groups, "probability")(args.folder)
            measured[window, lam] = {
                "recall": recall, "text": text,
                "text_margin": {k: text[k] - window_text[k] for k in text},
            }  # fmt: skip
            print(f"{args.folder}: window {window}, lam {lam:g}: {measured[window, lam]}",
                  flush=True)  # fmt: skip
    kept_window, kept_lam = kept_setting(measured, (saved.window, saved.lam))
    training_file = args.folder / TRAINING_RECORD
    record = json.loads(training_file.read_text()) if training_file.is_file() else {}
    earlier = {name: record.pop(name) for name in EARLIER_RECORDS if name in record}
    record[RECORD] = {
        "command": " ".join(["python scripts/choose_recency.py", *argv]),
        "capacity": saved.capacity,
        **data_record(sequences, window_text, groups, args.items, args.seed),
        "python": platform.python_version(),
        "measured": [{"window": w, "lam": lam, **m} for (w, lam), m in measured.items()],
        "saved_before": {"window": saved.window, "lam": saved.lam},
        "kept": {"window": kept_window, "lam": kept_lam},
        "minutes": round((time.perf_counter() - start) / 60, 2),
        **({"replaces": earlier} if earlier else {}),
    }  # fmt: skip
    rewrite(args.folder, split_config(saved, kept_window, kept_lam), record, args.model)
    print(f"{args.folder}: kept window {kept_window}, lam {kept_lam:g} "
          f"(saved before: window {saved.window}, lam {saved.lam:g})")  # fmt: skip


if __name__ == "__main__":
    main()
