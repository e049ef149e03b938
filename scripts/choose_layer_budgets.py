"""Choose a saved scorer's per-layer budget and recency term: how its memory is shared.

    python scripts/choose_layer_budgets.py kvpop_compile/embedded/scorers/memory-256 \\
        --layer 3 --others 64 128 192 --windows 96 192 --lams 0 0.0005

One capacity in every layer gives each layer the same share of the cache, but layers differ in
what they need from far back: in the embedded model, layer 3 holds both the recent tokens that
ordinary text needs and the old lines a question asks about (docs/experiments.md, streaming
heads), while the other layers change either measure little. A per-layer budget
(``KVpopConfig`` with a window and a pool per layer) keeps the same total memory and gives
``--layer`` what the others give up. The recency term ``lam`` trades the same two measures
(``choose_recency.py``), so it is chosen with the budget: a ``lam`` that closes a text gap at
one budget may cost recall that a per-layer budget no longer needs to pay. This measures, with
the scorer's tensors unchanged:

* the saved configuration (one budget, or a per-layer budget this script kept before);
* for each capacity ``c`` of ``--others``, each window ``w`` of ``--windows`` and each ``lam``
  of ``--lams`` (default: the saved one; the list must hold it): every layer but ``--layer``
  keeps ``c`` slots, of which ``--other-pool`` are pool and the rest sinks and window;
  ``--layer`` keeps the rest of the total (the saved total, which the layers must share
  evenly), with a window of ``w`` and the rest pool.

on the two validation measures of ``choose_recency.py`` (text beside the ``window`` policy at
the saved total's capacity in every layer, the benchmark's baseline, all targets and long-range
ones; the mean probability of the exact answer on validation recall items), and keeps one by its
rule, fixed before any measure: of the candidates whose text accuracy is at least ``window``'s
on both, the one with the highest recall measure (the saved one stays unless another beats it by
more than ``choose_recency.lead_needed``: twice the standard error of the per-item differences,
and at least ``choose_priority_span.TIE``); where none reaches ``window``, the closest.
``FOLDER`` is rewritten in one swap with the kept budget and ``lam`` (tensors unchanged) and a
``layer_budget_selection`` record in ``training.json`` of every measure; an earlier one moves
under ``replaces``.
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
sys.path.insert(0, str(Path(__file__).resolve().parent))

from choose_priority_span import rewrite  # noqa: E402
from choose_recency import (  # noqa: E402
    best_eligible,
    check_lams,
    data_record,
    kept_setting,
    lead_needed,
    text_accuracy,
    validation_data,
    validation_measure,
)
from choose_streaming_heads import window_policy  # noqa: E402
from embedded_scorers.candidates import SELECT_MEASURES  # noqa: E402
from embedded_scorers.folders import TRAINING_RECORD, with_tensors  # noqa: E402

import kvpop_compile as kc  # noqa: E402
from kvpop_compile.embedded import load_embedded_model  # noqa: E402
from kvpop_compile.scorer_io import saved_config, saved_shape  # noqa: E402

RECORD = "layer_budget_selection"
Budget = tuple[tuple[int, ...], tuple[int, ...]]  # (windows, topks), one entry per layer
Setting = tuple[tuple[int, ...], tuple[int, ...], float]  # (windows, topks, lam)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path, help="a saved scorer folder (scorer.json and tensors)")
    p.add_argument("--layer", type=int, required=True, help="the layer given the others' slots")
    p.add_argument("--others", nargs="+", type=int, required=True,
                   help="capacities of every other layer to measure")  # fmt: skip
    p.add_argument("--windows", nargs="+", type=int, required=True,
                   help="windows of --layer to measure")  # fmt: skip
    p.add_argument("--lams", nargs="+", type=float,
                   help="recency terms to measure at each budget, the saved one among them "
                        "(default: the saved one)")  # fmt: skip
    p.add_argument("--other-pool", type=int, default=16, help="pool slots of every other layer")
    p.add_argument("--sequences", type=int, default=24, help="validation text windows")
    p.add_argument("--items", type=int, default=16, help="recall items per family group and task")
    p.add_argument("--seed", type=int, default=99, help="seed of the recall items")
    p.add_argument("--model", type=Path, help="model folder (default: the embedded model)")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    return p.parse_args(argv)


def layer_budget(config: kc.KVpopConfig, layers: int) -> Budget:
    """``config``'s windows and pools, one entry per layer (one budget repeated)."""
    if config.per_layer is not None:
        return tuple(config.window), tuple(config.topk)
    return (config.window,) * layers, (config.topk,) * layers


def even_capacity(saved: kc.KVpopConfig, layers: int, folder: Path) -> int:
    """The capacity of every layer that keeps ``saved``'s total memory: the budget of the
    ``window`` baseline and of the candidates' total; ``SystemExit`` where the layers cannot
    share the total evenly."""
    total = sum(saved.capacities) if saved.per_layer is not None else saved.capacity * layers
    if total % layers:
        raise SystemExit(f"{folder} keeps {list(saved.capacities)} slots per layer, {total} in "
                         f"all, which {layers} layers cannot share evenly")  # fmt: skip
    return total // layers


def candidates(saved: kc.KVpopConfig, layers: int, args) -> list[Budget]:
    """The per-layer budgets of the module docstring, in the order of ``--others`` then
    ``--windows``; ``SystemExit`` naming a value that leaves a layer no window or pool slot."""
    if not 0 <= args.layer < layers:
        raise SystemExit(f"--layer must be from 0 to {layers - 1}, got {args.layer}")
    if args.other_pool < 1:
        raise SystemExit(f"--other-pool must be 1 or more, got {args.other_pool}")
    for name, value in (("--sequences", args.sequences), ("--items", args.items),
                        ("--threads", args.threads)):  # fmt: skip
        if value < 1:
            raise SystemExit(f"{name} must be 1 or more, got {value}")
    total = even_capacity(saved, layers, args.folder) * layers
    budgets = []
    for other in args.others:
        if other < saved.sinks + args.other_pool + 1:
            raise SystemExit(f"--others {other} leaves no window: each other layer keeps "
                             f"{saved.sinks} sinks and {args.other_pool} pool slots")  # fmt: skip
        wide = total - other * (layers - 1)
        if wide < saved.sinks + 2:
            most = (total - saved.sinks - 2) // (layers - 1)
            raise SystemExit(f"--others {other} leaves layer {args.layer} {wide} of the {total} "
                             f"slots, too few for {saved.sinks} sinks, a window and a pool: "
                             f"give --others {most} or less")  # fmt: skip
        for window in args.windows:
            if not 1 <= window <= wide - saved.sinks - 1:
                raise SystemExit(f"--windows {window} must be from 1 to {wide - saved.sinks - 1}"
                                 f" (layer {args.layer} keeps {wide} slots beside --others "
                                 f"{other})")  # fmt: skip
            windows = [other - saved.sinks - args.other_pool] * layers
            topks = [args.other_pool] * layers
            windows[args.layer], topks[args.layer] = window, wide - saved.sinks - window
            budgets.append((tuple(windows), tuple(topks)))
    if len(set(args.others)) != len(args.others) or len(set(args.windows)) != len(args.windows):
        raise SystemExit(f"--others {' '.join(map(str, args.others))} and --windows "
                         f"{' '.join(map(str, args.windows))} list a budget twice: give each "
                         "value once")  # fmt: skip
    return budgets


def settings(saved: kc.KVpopConfig, layers: int, args) -> list[Setting]:
    """The saved setting, then every budget of :func:`candidates` at each ``--lams`` (checked as
    ``choose_recency.py`` checks them), without repeating the saved one."""
    lams = check_lams(args.lams or [saved.lam], saved.lam)
    first = (*layer_budget(saved, layers), saved.lam)
    rest = [(w, k, lam) for w, k in candidates(saved, layers, args) for lam in lams]
    return [first, *(setting for setting in rest if setting != first)]


def main(argv=None) -> None:
    """Measure, choose and rewrite the folder (module docstring)."""
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    saved = saved_config(args.folder)
    layers = saved_shape(args.folder)["num_layers"]
    measured_settings = settings(saved, layers, args)
    capacity = even_capacity(saved, layers, args.folder)
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    sequences, ids, long_range, groups = validation_data(args.sequences, args.items, args.seed)
    even = kc.KVpopConfig(sinks=saved.sinks, window=capacity - saved.sinks - 1, topk=1)
    baseline = kc.transform(load_embedded_model(path=args.model), window_policy(even))
    window_text = text_accuracy(baseline, ids, long_range)
    print(f"window @ capacity {capacity}: text {window_text}", flush=True)
    measured = {}
    for windows, topks, lam in measured_settings:
        config = dataclasses.replace(saved, window=windows, topk=topks, lam=lam)
        model = with_tensors(kc.transform(load_embedded_model(path=args.model), config),
                             args.folder)  # fmt: skip
        text = text_accuracy(model, ids, long_range)
        measured[windows, topks, lam] = validation_measure(
            model, text, SELECT_MEASURES["probability"], groups, window_text
        )
        shown = {k: v for k, v in measured[windows, topks, lam].items() if k != "recall_items"}
        print(f"{args.folder}: capacities {list(config.capacities)}, windows {list(windows)}, "
              f"lam {lam:g}: {shown}", flush=True)  # fmt: skip
    first = measured_settings[0]
    kept = kept_setting(measured, first)
    best = best_eligible(measured)  # recorded with the lead it needed, kept or not
    training_file = args.folder / TRAINING_RECORD
    record = json.loads(training_file.read_text()) if training_file.is_file() else {}
    earlier = record.pop(RECORD, None)
    record[RECORD] = {
        "command": " ".join(["python scripts/choose_layer_budgets.py", *argv]),
        "capacity": capacity, "saved_lam": saved.lam,
        **data_record(sequences, window_text, groups, args.items, args.seed),
        "python": platform.python_version(),
        "measured": [{"window": list(w), "topk": list(k), "lam": lam,
                      "capacities": [saved.sinks + a + b for a, b in zip(w, k, strict=True)],
                      **{name: v for name, v in m.items() if name != "recall_items"}}
                     for (w, k, lam), m in measured.items()],
        "kept": {"window": list(kept[0]), "topk": list(kept[1]), "lam": kept[2]},
        **({"best_eligible": {
            "window": list(best[0]), "topk": list(best[1]), "lam": best[2],
            "lead": measured[best]["recall"] - measured[first]["recall"],
            "lead_needed": lead_needed(measured[best], measured[first]),
        }} if best is not None else {}),
        "minutes": round((time.perf_counter() - start) / 60, 2),
        **({"replaces": earlier} if earlier else {}),
    }  # fmt: skip
    config = saved if kept == first else dataclasses.replace(saved, window=kept[0],
                                                             topk=kept[1], lam=kept[2])  # fmt: skip
    rewrite(args.folder, config, record, args.model)
    print(f"{args.folder}: kept {list(config.capacities)} slots per layer, windows "
          f"{list(kept[0])}, lam {kept[2]:g}")  # fmt: skip


if __name__ == "__main__":
    main()
