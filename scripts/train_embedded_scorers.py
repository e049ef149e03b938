"""Train the embedded model's KVpop scorers (``memory`` and ``mlp``) for the quality benchmark.

    python scripts/train_embedded_scorers.py                          # all four, ~1 h on 2 cores
    python scripts/train_embedded_scorers.py --policies memory --capacities 256 --steps 2 \\
        --out /tmp/scorers                                            # smoke run

Each scorer is trained with :func:`kvpop_compile.train_scorer` (the model frozen, the boundary
loss against the future-attention target) on the embedded model's *training* files only, at the
benchmark's budgets: 4 sinks and a window of 64 inside a capacity of 512 (75% compression of
2048 tokens) or 256 (88%). Each lands in ``<out>/<policy>-<capacity>/`` (``scorer.json``,
``scorer.safetensors``, ``training.json`` with the settings and the held-out ranking accuracy),
written there only once complete. Work folders under ``--work`` hold checkpoints: a rerun resumes.

``--train-capacity C`` trains every scorer at capacity ``C`` (the pool boundary its loss
ranks tokens at) and saves it for each of ``--capacities``: a scorer's priorities do not
depend on the pool's size, and one trained at the tighter budget ranks the few tokens a later
question needs more sharply, which a larger pool then also holds.

``--train-window W`` trains with a window of ``W`` most recent tokens (64), and ``--windows W
...`` (one per capacity) saves each scorer for another window than that: ``kvpop-compile eval``
and the demo run a scorer at the window it was saved with. A window is a choice of the budget's
split, not of the weights: the scorer scores each token as it leaves the window, whenever that
is. ``--scorer-hidden`` sets the readout MLP's width (64).

``--layer-windows W0 W1 ... --layer-topks K0 K1 ...`` trains at a per-layer budget (each layer's
loss ranks tokens at its own pool boundary, as :func:`kvpop_compile.train_scorer` does for a
per-layer config), selects candidates there and saves the scorer with it; ``--capacities`` then
names one capacity, the layers' average (the folder's name).

``--recall-fraction`` makes that share of the sequences long-range recall items of the training
split (:mod:`kvpop_compile.embedded.recall`, built from training files only): there the question
at the end attends to a definition far back, which is what a scorer must learn to keep. Every
sequence is one 2048-byte window or one item, so packing never cuts an item.
``--decode-fraction`` makes that share recall items of the training split asked the decode way
(:func:`kvpop_compile.training.recall_data.stretched_sequences`): a 1024-byte item cut before
its question, the model's own greedy continuation filling the sequence to 2048 tokens, then the
question and the answer. A scorer trained on them sees the tokens its model writes compete for the
pool with the line a question will need, as in a long generation. ``--select-protocols prefill
decode`` adds as many 1024-byte items per family group and task, asked the decode way, to the
selection measure. The shipped scorers use neither: on the embedded model a
scorer trained so recalled less (docs/experiments.md, 2026-12-07).

``--init-from FOLDER`` starts each scorer from a saved one (a ``memory`` scorer from an ``mlp``
starts as exactly that ``mlp``, its memory read at zero weight). ``--select-items N`` keeps, of the
scorers at step 0 and at every evaluation, the best on ``N`` recall items per family group and task
(prefill protocol; by default the one answering the most of them exactly at the training
capacity), in the trained families and the validation ones
(:data:`kvpop_compile.training.selection.SELECTION_FAMILIES`): syntaxes no benchmark row asks,
beside the trained ones. Those items are drawn with ``--select-seed`` from ``--select-split``:
``validation`` (the default: the standard library's test folder, which the corpus leaves out:
code the model never saw, as the held-out files are to it, and that no benchmark asks about) or
``train`` (training files, never the training items' seed). Never held-out code or held-out
families. A work folder's ``run.json`` records the command that trains there and its
measure, and a run with another measure is refused there. ``--reselect`` measures the candidates a
finished run in ``--work`` measured (its report's steps) with this run's measure and keeps the best,
without training again (the folder's own ``scorer/`` stays the run's choice); ``training.json`` then
records both measures and the training command. The test suite differs between Python releases, so
the record holds the Python version and the SHA-256 of the items measured. ``--select-measure
probability`` measures each item by the probability the candidate gives its exact answer
(teacher-forced) instead of whether the greedy answer is exact: two candidates that answer as many
items exactly still differ in it, so it ranks them. ``--select-at saved`` (with ``--reselect``)
measures the candidates at each saved capacity and window instead of the training ones, so each
saved scorer is the run's best for its own budget.

The shipped scorers: ``mlp`` first, then ``memory`` started from it, trained with a window of 96
and saved for 256 of its 512 slots and 96 of 256 (the run with ``--seed 1``; candidates at steps
0, 50 and 100, saved by a one-item-per-task measure whose own choice the second command below
replaces; the runs were made with ``--work`` and ``--out`` in scratch folders)::

    python scripts/train_embedded_scorers.py --policies mlp --capacities 512 256 \\
        --train-capacity 256 --recall-fraction 0.5 --target max --priority-span 10 \\
        --scorer-hidden 256
    python scripts/train_embedded_scorers.py --policies memory --capacities 256 --windows 96 \\
        --train-window 96 --train-capacity 256 --recall-fraction 0.5 --target max \\
        --priority-span 10 --scorer-hidden 256 --init-from kvpop_compile/embedded/scorers/mlp-256 \\
        --lr 3e-4 --steps 100 --eval-every 50 --select-items 1 --select-split validation \\
        --seed 1 --threads 1

then that run's candidates chosen again for each saved budget by the probability of the exact
answer on 64 validation items per task (step 50 kept for both; the items then had no family
groups), in the same ``--work`` folder::

    python scripts/train_embedded_scorers.py --policies memory --capacities 512 256 \\
        --windows 256 96 --train-window 96 --train-capacity 256 --recall-fraction 0.5 \\
        --target max --priority-span 10 --scorer-hidden 256 \\
        --init-from kvpop_compile/embedded/scorers/mlp-256 --lr 3e-4 --steps 100 --eval-every 50 \\
        --seed 1 --select-items 64 --select-split validation --select-measure probability \\
        --select-at saved --reselect --threads 2

and last, each ``memory`` folder saved with the priority span the same measure chose for its
budget (8 at 88%, 6 at 75%), which ``training.json`` records under ``priority_span_selection``::

    python scripts/choose_priority_span.py kvpop_compile/embedded/scorers/memory-256 \\
        --spans 6 8 10 12 16 --threads 1
    python scripts/choose_priority_span.py kvpop_compile/embedded/scorers/memory-512 \\
        --spans 6 8 10 12 16 --threads 1
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import random
import sys
import time
from pathlib import Path

import torch

# Runs from a clone without installing the package; the script's own folder holds its pieces
# (``embedded_scorers``), which is on the path already when run as a file but not with ``-m``.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(1, str(Path(__file__).resolve().parent))

from embedded_scorers.candidates import (  # noqa: E402
    DECODE_LENGTH,
    SELECT_MEASURES,
    decode_selection_items,
    recall_selection,
    reselect,
    selection_items,
    selection_spec,
)
from embedded_scorers.folders import (  # noqa: E402
    claim_work,
    finished_run,
    install,
)

import kvpop_compile as kc  # noqa: E402
from kvpop_compile.embedded import load_embedded_model, split_files  # noqa: E402
from kvpop_compile.embedded.corpus import read_bytes  # noqa: E402
from kvpop_compile.embedded.recall import TASKS, recall_items  # noqa: E402
from kvpop_compile.evaluation.data import SEQUENCE_LENGTH  # noqa: E402
from kvpop_compile.evaluation.methods import (  # noqa: E402
    BUDGETS,
    EMBEDDED_SCORERS,
    WINDOW,
    budget_config,
    scorer_folder,
)
from kvpop_compile.evaluation.recall.protocol import RECALL_PROTOCOLS  # noqa: E402
from kvpop_compile.fingerprints import items_sha256  # noqa: E402
from kvpop_compile.scorer_io import tensors_sha256  # noqa: E402
from kvpop_compile.training.recall_data import stretched_sequences  # noqa: E402
from kvpop_compile.training.selection import SELECTION_SPLITS  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    # No abbreviations: a prefix of one flag (--window for --windows) must not pass for it.
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--policies", nargs="+", default=["memory", "mlp"], choices=["memory", "mlp"])
    p.add_argument(
        "--capacities", nargs="+", type=int, default=sorted(BUDGETS.values(), reverse=True)
    )
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--eval-sequences", type=int, default=24, help="held-out sequences")
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--recall-fraction", type=float, default=0.0, help="share of sequences that are recall"
    )
    p.add_argument(
        "--decode-fraction", type=float, default=0.0,
        help="share of sequences that are recall items asked the decode way: the model's own "
        "continuation between the item's prompt and its question",
    )  # fmt: skip
    p.add_argument(
        "--target", default="mean", choices=["mean", "max", "power_mean"],
        help="aggregate of future attention the scorers learn (mean: the design's)",
    )  # fmt: skip
    p.add_argument(
        "--target-power", type=float, default=None,
        help="the power of --target power_mean, above 1 (1 is the mean, infinity the max)",
    )  # fmt: skip
    p.add_argument(
        "--loss", default="boundary", choices=["boundary", "gap"],
        help="boundary: every decision counts once; gap: each weighted by its gap under the target",
    )  # fmt: skip
    p.add_argument(
        "--priority-span", type=int, default=0,
        help="KVpopConfig.priority_span the scorers are trained and saved with (the span "
        "kvpop-compile eval and demo then use)",
    )  # fmt: skip
    p.add_argument(
        "--lam", type=float, default=0.0,
        help="KVpopConfig.lam the scorers are trained and saved with: a priority of rhat + lam "
        "* position in the loss's decisions and at inference (0: no recency term)",
    )  # fmt: skip
    p.add_argument(
        "--train-capacity", type=int, default=None,
        help="train at this capacity and save for each of --capacities (default: each its own)",
    )  # fmt: skip
    p.add_argument(
        "--train-window", type=int, default=WINDOW,
        help=f"the window (most recent tokens always kept) while training ({WINDOW})",
    )  # fmt: skip
    p.add_argument(
        "--windows", nargs="+", type=int, default=None,
        help="the window each saved scorer runs at, one per --capacities (default: "
        "--train-window); eval and demo run a scorer at the window it was saved with",
    )  # fmt: skip
    p.add_argument(
        "--layer-windows", nargs="+", type=int, default=None, metavar="W",
        help="train and save at a per-layer budget: one window per layer (with --layer-topks; "
        "one --capacities, their layers' average)",
    )  # fmt: skip
    p.add_argument(
        "--layer-topks", nargs="+", type=int, default=None, metavar="K",
        help="the pool of each layer of the per-layer budget (with --layer-windows)",
    )  # fmt: skip
    p.add_argument(
        "--scorer-hidden", type=int, default=64,
        help="hidden width of the scorers' readout MLP (KVpopConfig.scorer_hidden, 64)",
    )  # fmt: skip
    p.add_argument(
        "--init-from", type=Path, default=None, metavar="SCORER_FOLDER",
        help="start each scorer from this saved scorer (TrainSettings.init_from)",
    )  # fmt: skip
    p.add_argument(
        "--select-items", type=int, default=0,
        help="keep the candidate answering the most of this many recall items per family group "
        "(trained and validation families) and task of --select-split (0: keep the last step)",
    )  # fmt: skip
    p.add_argument("--select-seed", type=int, default=99, help="seed of the selection items")
    p.add_argument(
        "--select-split", default="validation", choices=SELECTION_SPLITS,
        help="the recall items' code: the standard library's test folder (validation, the "
        "default: code the model never saw, and no benchmark asks about), or training files",
    )  # fmt: skip
    p.add_argument(
        "--select-measure", default="exact", choices=sorted(SELECT_MEASURES),
        help="per item: exact (the greedy answer is exact, 1 or 0) or probability (of the exact "
        "answer, teacher-forced); a candidate's measure is the mean over the items",
    )  # fmt: skip
    p.add_argument(
        "--select-protocols", nargs="+", default=["prefill"], choices=RECALL_PROTOCOLS,
        help=f"the protocols the selection items are asked in (decode: {DECODE_LENGTH}-byte "
        "items, the model's own continuation before the question)",
    )  # fmt: skip
    p.add_argument(
        "--select-at", default="training", choices=["training", "saved"],
        help="measure candidates at the training capacity and window, or (with --reselect) at "
        "each saved capacity and window, so that each saved scorer is chosen for its own budget",
    )  # fmt: skip
    p.add_argument(
        "--reselect", action="store_true",
        help="measure the candidates a finished run in --work measured with this run's selection "
        "measure and keep the best, instead of the one the run kept (the work folder's scorer/ "
        "stays the run's own choice)",
    )  # fmt: skip
    p.add_argument("--model", type=Path, help="model folder (default: the embedded model)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per process")
    p.add_argument("--out", type=Path, default=EMBEDDED_SCORERS)
    p.add_argument("--work", type=Path, default=Path("scorer-runs"), help="checkpoints")
    return p.parse_args(argv)


def _windows(data: bytes) -> list[str]:
    """The whole ``SEQUENCE_LENGTH``-byte windows of ``data`` whose text encodes back to exactly
    that many bytes (a window that cuts a multi-byte character does not), so that every text
    packs into exactly one sequence."""
    texts = []
    for start in range(0, len(data) - SEQUENCE_LENGTH + 1, SEQUENCE_LENGTH):
        text = data[start : start + SEQUENCE_LENGTH].decode("utf-8", errors="replace")
        if len(text.encode()) == SEQUENCE_LENGTH:
            texts.append(text)
    return texts


def byte_ids(text: str) -> list[int]:
    """The byte tokens of a training text: its UTF-8 bytes, where a byte of the model's own
    continuation that is no UTF-8 travels in the text as a lone surrogate
    (:func:`training_texts`), so every sequence keeps its bytes exactly."""
    return list(text.encode("utf-8", "surrogateescape"))


def check_fractions(recall_fraction: float, decode_fraction: float) -> None:
    """``ValueError`` naming a share of recall items or decode items outside [0, 1), or two
    that leave no ordinary text."""
    for name, value in (("--recall-fraction", recall_fraction),
                        ("--decode-fraction", decode_fraction)):  # fmt: skip
        if not 0 <= value < 1:
            raise ValueError(f"{name} must be in [0, 1), got {value}")
    if recall_fraction + decode_fraction >= 1:
        raise ValueError(
            f"--recall-fraction {recall_fraction} and --decode-fraction {decode_fraction} leave "
            "no ordinary text: their sum must be below 1"
        )


def training_texts(
    sequences: int,
    seed: int,
    recall_fraction: float = 0.0,
    decode_fraction: float = 0.0,
    model=None,
) -> list[str]:
    """``sequences`` texts of one sequence each (in :func:`byte_ids`), in a seeded order:
    windows of training-split files, a ``recall_fraction`` share of training-split recall items,
    and a ``decode_fraction`` share of training-split items asked the decode way, their
    continuations written by ``model`` (tasks in turn in each share)."""
    check_fractions(recall_fraction, decode_fraction)
    recall_count = round(sequences * recall_fraction)
    decode_count = round(sequences * decode_fraction)
    if decode_count and model is None:
        raise ValueError("items asked the decode way need the model that continues them")
    plain = sequences - recall_count - decode_count  # text windows fill what neither share takes
    train, _ = split_files()
    order = list(train)
    random.Random(seed).shuffle(order)
    texts: list[str] = []
    for name in order:
        if len(texts) >= plain:
            break
        texts.extend(_windows(read_bytes(name)))
    texts = texts[:plain]
    per_task = -(-recall_count // len(TASKS))
    items = [
        recall_items("train", task, SEQUENCE_LENGTH, per_task, seed, families="train")
        for task in TASKS
    ]
    recall = []
    for i in range(per_task):
        for group in items:
            text = (group[i].prompt + group[i].answer).decode("utf-8", errors="replace")
            if len(text.encode()) == SEQUENCE_LENGTH:  # packs into exactly one sequence
                recall.append(text)
    texts += recall[:recall_count]
    texts += _decode_texts(decode_count, seed, model)
    random.Random(seed + 1).shuffle(texts)
    return texts


def _decode_texts(count: int, seed: int, model) -> list[str]:
    """``count`` training-split items of :data:`DECODE_LENGTH` bytes (tasks in turn), each with
    ``model``'s own continuation before its question, as texts of ``SEQUENCE_LENGTH`` bytes."""
    per_task = -(-count // len(TASKS))
    groups = [recall_items("train", task, DECODE_LENGTH, per_task, seed, families="train")
              for task in TASKS]  # fmt: skip
    items = [group[i] for i in range(per_task) for group in groups][:count]
    if not items:
        return []
    rows = stretched_sequences(model, items, SEQUENCE_LENGTH)
    return [bytes(row.tolist()).decode("utf-8", "surrogateescape") for row in rows]


def scorer_config(policy: str, capacity: int, window: int, args) -> kc.KVpopConfig:
    """The benchmark's config for ``policy`` at ``capacity`` and ``window`` (or at the per-layer
    budget of ``--layer-windows`` and ``--layer-topks``), with the run's ``--priority-span``,
    ``--lam`` and ``--scorer-hidden``."""
    if args.layer_windows is not None:
        config = budget_config(policy, capacity, args.priority_span, tuple(args.layer_windows),
                               topk=tuple(args.layer_topks))  # fmt: skip
    else:
        config = budget_config(policy, capacity, args.priority_span, window)
    return dataclasses.replace(config, scorer_hidden=args.scorer_hidden, lam=args.lam)


def check_layer_budget(args, argv: list[str]) -> None:
    """Refuse a per-layer budget (``--layer-windows``/``--layer-topks``) given incompletely or
    with the options of one budget: it is both the training budget and the saved one."""
    given = (args.layer_windows is not None, args.layer_topks is not None)
    if not any(given):
        return
    if not all(given):
        raise SystemExit("a per-layer budget needs both --layer-windows and --layer-topks")
    if len(args.layer_windows) != len(args.layer_topks):
        raise SystemExit(
            f"--layer-windows lists {len(args.layer_windows)} layers and --layer-topks "
            f"{len(args.layer_topks)}: give one window and one pool per layer"
        )
    set_values = {"--train-capacity": args.train_capacity is not None,
                  "--train-window": any(a.split("=")[0] == "--train-window" for a in argv),
                  "--windows": args.windows is not None,
                  "--select-at": args.select_at != "training"}  # fmt: skip
    clashing = [name for name, given in set_values.items() if given]
    if clashing:
        raise SystemExit(
            f"{', '.join(clashing)} set a one-budget split; a per-layer budget is the budget the "
            "scorers train, are selected and are saved at: leave them out"
        )
    if len(args.capacities) != 1:
        raise SystemExit(
            f"a per-layer budget saves one scorer per policy: give one --capacities (the "
            f"layers' average), got {' '.join(map(str, args.capacities))}"
        )
    try:
        config = budget_config("memory", args.capacities[0], 0, tuple(args.layer_windows),
                               topk=tuple(args.layer_topks))  # fmt: skip
    except ValueError as error:
        raise SystemExit(f"--layer-windows/--layer-topks: {error}") from None
    if config.max_capacity >= SEQUENCE_LENGTH:
        raise SystemExit(
            f"--layer-windows/--layer-topks keep {config.max_capacity} slots in a layer: the "
            f"{SEQUENCE_LENGTH}-token training sequences would never make it drop a token"
        )


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.select_items < 0:
        raise SystemExit(f"--select-items must be 0 or more, got {args.select_items}")
    if args.reselect and not args.select_items:
        raise SystemExit("--reselect chooses by the selection measure: give --select-items N")
    if args.select_at == "saved" and not args.reselect:
        # Capacities trained at one capacity share one run, which keeps one candidate; each
        # saved budget gets its own choice only among a finished run's candidates.
        raise SystemExit(
            "--select-at saved chooses among a finished run's candidates for each saved "
            "budget: train with --select-at training first, then add --reselect"
        )
    same_items = args.select_split == "train" and args.select_seed == args.seed
    if args.select_items and (args.recall_fraction or args.decode_fraction) and same_items:
        raise SystemExit(
            f"--select-seed {args.select_seed} equals --seed: the selection items would be "
            "the training items; choose another"
        )
    check_layer_budget(args, argv)
    windows = args.windows or [args.train_window] * len(args.capacities)
    if len(windows) != len(args.capacities):
        raise SystemExit(
            f"--windows gives {len(windows)} windows for {len(args.capacities)} --capacities "
            f"{' '.join(map(str, args.capacities))}: give one per capacity"
        )
    torch.set_num_threads(args.threads)
    train_sequences = args.steps * args.batch_size
    total = train_sequences + args.eval_sequences
    try:
        check_fractions(args.recall_fraction, args.decode_fraction)
        # The target and its power, refused before any model or text is loaded.
        kc.TrainSettings(target=args.target, target_power=args.target_power)
    except ValueError as error:
        raise SystemExit(str(error)) from None
    writer = load_embedded_model(path=args.model) if args.decode_fraction else None
    texts = training_texts(total, args.seed, args.recall_fraction, args.decode_fraction, writer)
    eval_fraction = args.eval_sequences / total
    command = " ".join(["python scripts/train_embedded_scorers.py", *argv])
    spec = selection_spec(args)
    measured_once: dict[tuple, tuple] = {}  # --reselect: (work, budget) -> measured candidates
    # The items do not depend on the policy or capacity; made before any work folder is claimed,
    # since making them may stop the run (validation text missing).
    groups = None if spec is None else selection_items(
        args.select_split, args.select_items, args.select_seed
    )  # fmt: skip
    decode_groups = [] if spec is None or "decode" not in args.select_protocols else (
        decode_selection_items(args.select_split, args.select_items, args.select_seed)
    )  # fmt: skip
    if "prefill" not in args.select_protocols:
        groups = None if groups is None else []
    for policy in args.policies:
        for capacity, window in zip(args.capacities, windows, strict=True):
            trained_at = args.train_capacity or capacity
            config = scorer_config(policy, capacity, window, args)
            train_config = scorer_config(policy, trained_at, args.train_window, args)
            model = load_embedded_model(path=args.model)
            if config.per_layer is not None:  # then train_config is config (check_layer_budget)
                # Named by each layer's capacity and window: budgets of equal capacities
                # but other windows train in folders of their own.
                layers = zip(train_config.capacities, train_config.window, strict=True)
                work = args.work / f"{policy}-{'-'.join(f'{c}w{w}' for c, w in layers)}"
            else:
                work = args.work / f"{policy}-{trained_at}"
            run = finished_run(work, args.steps) if args.reselect else {}
            select_config = config if args.select_at == "saved" else train_config
            select = None if groups is None else recall_selection(
                args.model, select_config, groups, args.select_measure, decode_groups
            )  # fmt: skip
            if not args.reselect:
                claim_work(work, command, spec)
            print(f"{policy} trained at capacity {trained_at}: {train_config}", flush=True)
            start = time.perf_counter()
            settings = kc.TrainSettings(
                steps=args.steps, seq_len=SEQUENCE_LENGTH, batch_size=args.batch_size, lr=args.lr,
                target=args.target, target_power=args.target_power, loss=args.loss,
                eval_fraction=eval_fraction,
                eval_every=args.eval_every, checkpoint_every=10, seed=args.seed,
                init_from=args.init_from,
            )  # fmt: skip
            report = kc.train_scorer(
                model, texts, train_config, settings, output_dir=work, select=select,
                tokenizer=byte_ids,
            )  # fmt: skip
            scorer, selection = report.scorer_path, None
            if spec is not None:
                selection = {
                    **spec, "items_sha256": items_sha256(
                        i for group in [*groups, *decode_groups] for i in group
                    ),
                    "python": platform.python_version(),
                    "measured": report.selections, "kept_step": report.selected_step,
                }  # fmt: skip
            if args.reselect:
                key = (work, select_config)
                scorer, selection = reselect(select, key, report, selection, run, measured_once)
            minutes = (time.perf_counter() - start) / 60
            starting_scorer = None
            if args.init_from is not None:
                starting_scorer = {
                    "path": str(args.init_from),
                    "tensors_sha256": tensors_sha256(args.init_from),
                }
            record = {
                "command": command,
                "policy": policy,
                "capacity": capacity,
                # A per-layer run trained at no one capacity: its layers' are the next field.
                "trained_at_capacity": None if config.per_layer is not None else trained_at,
                "trained_at_capacities": list(train_config.capacities),
                "sinks": config.sinks,
                "window": config.window,
                "trained_with_window": train_config.window,
                "scorer_hidden": config.scorer_hidden,
                "topk": config.topk,
                "steps": args.steps,
                "batch_size": args.batch_size,
                "seq_len": SEQUENCE_LENGTH,
                "lr": args.lr,
                "loss": args.loss,
                "target": args.target,
                **({} if args.target_power is None else {"target_power": args.target_power}),
                "seed": args.seed,
                "recall_fraction": args.recall_fraction,
                "decode_fraction": args.decode_fraction,
                "priority_span": args.priority_span,
                "lam": args.lam,
                "training_files_bytes": sum(len(byte_ids(t)) for t in texts),
                "init_from": starting_scorer,
                "held_out_ranking": report.evaluations,
                "selection": selection,
                "minutes_this_run": round(minutes, 2),
                "torch": torch.__version__,
            }
            install(scorer, scorer_folder(policy, capacity, args.out), record,
                    load_embedded_model(path=args.model), config)  # fmt: skip
            last = report.evaluations[-1] if report.evaluations else {}
            print(
                f"{policy}-{capacity}: held-out ranking accuracy {last.get('accuracy', 0):.3f} "
                f"after {args.steps} steps, {minutes:.1f} min",
                flush=True,
            )


if __name__ == "__main__":
    main()
