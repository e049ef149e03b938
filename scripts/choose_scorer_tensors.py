"""Choose between a saved scorer's tensors and a newly trained scorer's, at the saved budget.

    python scripts/choose_scorer_tensors.py kvpop_compile/embedded/scorers/memory-256 \\
        --candidate runs/decode-scorers/mlp-256 --decode-items 16

``FOLDER``'s budget (one, or one per layer), recency term and span stay as saved; what may
change is the trained tensors. Both ``FOLDER``'s own tensors and ``--candidate``'s are measured
at ``FOLDER``'s saved configuration on the validation measures of ``choose_layer_budgets.py``: text
beside the ``window`` policy at the saved total's capacity in every layer (the benchmark's
baseline), all targets and long-range ones; and the recall measure, the mean probability of the
exact answer on ``--items`` validation items per family group and task in the prefill protocol,
and on ``--decode-items`` items of 1024 bytes in the decode protocol (the model's own
continuation between binding and question, as in the benchmark's decode rows). The rule, fixed
before any measure: the candidate replaces ``FOLDER``'s tensors only if its text accuracy is at
least ``window``'s on both measures and its recall measure leads ``FOLDER``'s by more than
``choose_recency.lead_needed`` (twice the standard error of the paired per-item differences,
and at least ``choose_priority_span.TIE``); otherwise ``FOLDER`` stays as it is.

A ``memory`` folder takes an ``mlp`` candidate as a ``memory`` scorer whose readout gives its
memory read zero weight (the start ``train_scorer`` makes from an ``mlp``,
:mod:`kvpop_compile.training.warm_start`): it scores exactly as the candidate does. ``FOLDER``
is rewritten in one swap and its ``training.json`` gains a ``tensor_selection`` record of every
measure (an earlier one moves under ``replaces``), whichever is kept. Each measured entry names
how its tensors were trained (``recipe``: the command, target and target power its folder's
``training.json`` records), since the fields above the selection records stay those of the
folder's own training run when a candidate's tensors replace its own.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from choose_layer_budgets import even_capacity  # noqa: E402
from choose_recency import (  # noqa: E402
    data_record,
    lead_needed,
    text_accuracy,
    validation_data,
    validation_measure,
)
from choose_streaming_heads import window_policy  # noqa: E402
from embedded_scorers.candidates import SELECT_MEASURES, decode_selection_items  # noqa: E402
from embedded_scorers.folders import TRAINING_RECORD, with_tensors  # noqa: E402

import kvpop_compile as kc  # noqa: E402
from kvpop_compile.atomic import replace_folder  # noqa: E402
from kvpop_compile.embedded import load_embedded_model  # noqa: E402
from kvpop_compile.scorer_io import saved_config, saved_shape, tensors_sha256  # noqa: E402
from kvpop_compile.training.warm_start import warm_start  # noqa: E402

RECORD = "tensor_selection"
SAVED, CANDIDATE = "saved", "candidate"  # the two tensors the rule compares
RECIPE = ("command", "target", "target_power")  # a training record's fields that say how


def recipe(folder: Path) -> dict:
    """How ``folder``'s tensors were trained, as its ``training.json`` says (``RECIPE``'s
    fields it has; empty without one)."""
    training_file = folder / TRAINING_RECORD
    record = json.loads(training_file.read_text()) if training_file.is_file() else {}
    return {name: record[name] for name in RECIPE if name in record}


def kept_tensors(measured: dict[str, dict]) -> str:
    """The rule of the module docstring over ``measured`` (:data:`SAVED` and :data:`CANDIDATE`
    -> ``{"recall", "recall_items", "text_margin": {"all", "long_range"}}``, the margins over
    ``window``): the candidate only if both its margins are 0 or more and its recall measure
    leads the saved one's by more than :func:`choose_recency.lead_needed`. Whether the saved
    tensors keep ``window``'s text does not matter: a candidate must earn its place on both
    measures either way."""
    candidate, saved = measured[CANDIDATE], measured[SAVED]
    keeps_text = min(candidate["text_margin"].values()) >= 0
    lead = candidate["recall"] - saved["recall"]
    return CANDIDATE if keeps_text and lead > lead_needed(candidate, saved) else SAVED


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path, help="a saved scorer folder (scorer.json and tensors)")
    p.add_argument("--candidate", type=Path, required=True,
                   help="a saved scorer folder whose tensors may replace FOLDER's")  # fmt: skip
    p.add_argument("--sequences", type=int, default=24, help="validation text windows")
    p.add_argument("--items", type=int, default=16,
                   help="prefill recall items per family group and task")  # fmt: skip
    p.add_argument(
        "--decode-items",
        type=int,
        default=16,
        help="decode-protocol recall items per family group and task (0: none)",
    )
    p.add_argument("--seed", type=int, default=99, help="seed of the recall items")
    p.add_argument("--model", type=Path, help="model folder (default: the embedded model)")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    return p.parse_args(argv)


def scored(config: kc.KVpopConfig, folder: Path, candidate: Path | None, model_path):
    """The model transformed with ``config`` holding ``folder``'s tensors, or, with
    ``candidate``, that scorer's (loaded as :func:`warm_start` loads a start: every tensor of a
    scorer of the same kind, the readout of an ``mlp`` into a ``memory`` scorer, its memory read
    at zero weight). ``SystemExit`` naming a candidate that cannot stand for ``folder``'s kind."""
    model = with_tensors(kc.transform(load_embedded_model(path=model_path), config), folder)
    if candidate is not None:
        scorers = [layer.self_attn.scorer for layer in model.model.layers]
        try:
            warm_start(scorers, config.scorer, candidate)
        except ValueError as error:
            raise SystemExit(f"--candidate {candidate}: {error}") from None
    return model


def main(argv=None) -> None:
    """Measure both, choose by the rule and rewrite the folder (module docstring)."""
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    for name, value, least in (("--sequences", args.sequences, 1), ("--items", args.items, 1),
                               ("--decode-items", args.decode_items, 0),
                               ("--threads", args.threads, 1)):  # fmt: skip
        if value < least:
            raise SystemExit(f"{name} must be {least} or more, got {value}")
    saved = saved_config(args.folder)
    layers = saved_shape(args.folder)["num_layers"]
    capacity = even_capacity(saved, layers, args.folder)
    # Built before any measure, so that a candidate of the wrong kind is refused at once.
    models = {SAVED: scored(saved, args.folder, None, args.model),
              CANDIDATE: scored(saved, args.folder, args.candidate, args.model)}  # fmt: skip
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    sequences, ids, long_range, groups = validation_data(args.sequences, args.items, args.seed)
    decode_groups = []
    if args.decode_items:
        decode_groups = decode_selection_items("validation", args.decode_items, args.seed)
    even = kc.KVpopConfig(sinks=saved.sinks, window=capacity - saved.sinks - 1, topk=1)
    window_text = text_accuracy(kc.transform(load_embedded_model(path=args.model),
                                             window_policy(even)), ids, long_range)  # fmt: skip
    print(f"window @ capacity {capacity}: text {window_text}", flush=True)
    measured = {}
    for key, model in models.items():
        text = text_accuracy(model, ids, long_range)
        measured[key] = validation_measure(model, text, SELECT_MEASURES["probability"], groups,
                                           window_text, decode_groups)  # fmt: skip
        shown = {k: v for k, v in measured[key].items() if k != "recall_items"}
        print(f"{args.folder}, {key} tensors: {shown}", flush=True)
    kept = kept_tensors(measured)
    training_file = args.folder / TRAINING_RECORD
    record = json.loads(training_file.read_text()) if training_file.is_file() else {}
    earlier = record.pop(RECORD, None)
    record[RECORD] = {
        "command": " ".join(["python scripts/choose_scorer_tensors.py", *argv]),
        "capacity": capacity,
        **data_record(sequences, window_text, groups, args.items, args.seed, decode_groups),
        "python": platform.python_version(),
        "measured": [{"tensors": key, "tensors_sha256": tensors_sha256(path),
                      "recipe": recipe(path),
                      **{name: v for name, v in m.items() if name != "recall_items"}}
                     for (key, m), path in zip(measured.items(), (args.folder, args.candidate),
                                               strict=True)],
        "lead": measured[CANDIDATE]["recall"] - measured[SAVED]["recall"],
        "lead_needed": lead_needed(measured[CANDIDATE], measured[SAVED]),
        "kept": kept,
        "minutes": round((time.perf_counter() - start) / 60, 2),
        **({"replaces": earlier} if earlier else {}),
    }  # fmt: skip
    model = models[kept]

    def build(staging: Path) -> None:
        kc.save_scorer(model, staging)
        (staging / TRAINING_RECORD).write_text(json.dumps(record, indent=1) + "\n")
        for other in args.folder.iterdir():  # anything else a user keeps there goes along
            if not (staging / other.name).exists() and other.is_file():
                (staging / other.name).write_bytes(other.read_bytes())

    replace_folder(args.folder, build)
    print(
        f"{args.folder}: kept the {kept} tensors (lead {record[RECORD]['lead']:+.4f}, "
        f"needed {record[RECORD]['lead_needed']:.4f})"
    )


if __name__ == "__main__":
    main()
