"""Train the embedded byte-level Qwen3 on the Python standard library, from scratch, on CPU.

    python scripts/train_embedded_model.py                     # ~40 min of training, 2 threads
    python scripts/train_embedded_model.py --minutes 0.5 --out /tmp/x   # smoke run
    python scripts/train_embedded_model.py --init kvpop_compile/embedded/qwen3-stdlib --seed 1
                                                               # continue from a checkpoint
    python scripts/train_embedded_model.py ... --resume          # same arguments: continue a
                                                               # run that was cut off

Writes a Hugging Face folder (``config.json``, ``model.safetensors``) with ``split.json`` and
``MODEL_CARD.md``; the folder is assembled beside ``--out`` and renamed into place when complete.

The run is split by time (or by ``--steps``): the first ``1 - long_fraction`` of it trains on
512-byte windows, the rest on 2048-byte windows so that the model works at its full context.
The learning rate warms up linearly and decays on a cosine, both over the same progress
fraction. Windows start anywhere in the concatenated training files; the held-out evaluation
reads the first 2049 bytes of every held-out file that long.

With ``--recall-fraction``, that share of the 2048-byte rows are long-range recall items from the
training files (``kvpop_compile.embedded.recall``): 2048 bytes of items of one length drawn from
``--recall-lengths`` (256 to 2048; eight items to one), each item's task drawn from
``--recall-tasks`` (all four by default; repeat one to weight it). Short
items pack more answers into a row and put the answer nearer its question, which is where a
model that has never copied anything from far back (the shipped one) can start. The loss is the
mean over all bytes plus ``--recall-weight`` times the mean over the recall rows' questions and
answers (``assert QZWKRT == 4821``), which are a handful of bytes in 2048 and would barely count
otherwise. The question counts too because its name can be copied from the definition (all but
its first letter, which only ``multi_key`` narrows down): copying a rare name from far back is
the simplest form of the lookup, and a model that has never copied from far back (the shipped
one: its answer loss stayed at chance for 450 steps when only the answer was weighted) learns
it first. The held-out report adds full-attention exact
match on held-out recall items per task and length.

``--recall-stretch-fraction`` asks that share of the recall rows the way the benchmark's decode
protocol does: a 1024-byte item whose question comes after 1024 bytes standing for the model's
own greedy text (training code, then a short phrase or line repeated, as greedy decoding of this
model loops). A model trained only on questions right after code answered ``chain`` after its
own loop with the first hop alone (``assert b == `` → ``a`` and a new line). The stretch's bytes
are left out of the next-byte loss: the model should read past a loop, not learn to write one.
The held-out report then adds the decode protocol's exact match with the model's real greedy
stretch (``RECALL_DECODE_ITEMS`` per task).

``--copy-steps`` first trains that many steps on rows of a random string of 8-32 letters and
digits repeated (``copy_batch``). The text-trained model cannot copy at all: a block of code
repeated costs as much the second time as the first. Recall needs copying, and neither moved in
hundreds of steps of the recall mix; on copy rows alone copying appears after about 250 steps.

Every ``--checkpoint-every`` minutes the model, optimizer, random states and progress are
written atomically to ``--checkpoint-dir``; ``--resume`` with the same arguments continues from
there with the time already spent counted against the budget.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

# Runs from a clone without installing the package; the script's own folder holds its pieces
# (``embedded_model``), which is on the path already when run as a file but not with ``-m``.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(1, str(Path(__file__).resolve().parent))

from embedded_model.card import command_line, model_card, run_argv, save, this_run  # noqa: E402
from embedded_model.data_mix import LONG_LEN, training_stream  # noqa: E402
from embedded_model.evaluation import (  # noqa: E402
    RECALL_DECODE_ITEMS,
    RECALL_EVAL_ITEMS,
    RECALL_MONITOR_ITEMS,
    evaluate,
    evaluate_decode_recall,
    evaluate_recall,
    held_out_recall,
    held_out_sequences,
    recall_line,
)
from embedded_model.training_loop import save_checkpoint, train  # noqa: E402

from kvpop_compile.embedded import EMBEDDED_MODEL  # noqa: E402
from kvpop_compile.embedded.corpus import (  # noqa: E402
    HELD_OUT_MODULUS,
    read_bytes,
    split_files,
    stdlib_dir,
)
from kvpop_compile.embedded.recall import TASKS, TRAINING_LENGTHS  # noqa: E402

MODEL_SHAPE = {
    "vocab_size": 256,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": True,
    # 1e6 (Qwen3's value, for 32K+ contexts) would leave most of the 32 rotary frequencies
    # nearly constant over 2048 positions; 1e4 spreads them over this context.
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "bos_token_id": None,
    "eos_token_id": None,
    "pad_token_id": None,
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=EMBEDDED_MODEL, help="output model folder")
    p.add_argument("--minutes", type=float, default=40.0, help="training time budget")
    p.add_argument("--steps", type=int, default=None, help="fixed step count instead of time")
    p.add_argument(
        "--init",
        type=Path,
        default=None,
        help="continue from this model folder (its recipe.json is carried into the new card)",
    )
    p.add_argument("--long-fraction", type=float, default=0.25, help="share at 2048 tokens")
    p.add_argument("--batch-tokens", type=int, default=4096, help="tokens per optimizer step")
    p.add_argument("--lr", type=float, default=2e-3, help="peak learning rate")
    p.add_argument("--min-lr-ratio", type=float, default=0.1, help="final lr / peak lr")
    p.add_argument("--warmup", type=float, default=0.03, help="warmup share of the run")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--eval-seqs", type=int, default=0, help="held-out sequences (0: all)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=20)
    p.add_argument(
        "--recall-fraction", type=float, default=0.0, help="share of 2048-byte rows that are recall"
    )
    p.add_argument(
        "--recall-weight",
        type=float,
        default=1.0,
        help="weight of the mean loss over recall questions and answers",
    )
    p.add_argument(
        "--recall-lengths",
        default=",".join(map(str, TRAINING_LENGTHS)),
        help="item lengths a recall row draws from, uniformly (repeat one to weight it)",
    )
    p.add_argument(
        "--recall-tasks",
        default=",".join(TASKS),
        help="tasks a recall item draws from, uniformly (repeat one to weight it)",
    )
    p.add_argument(
        "--recall-stretch-fraction",
        type=float,
        default=0.0,
        help="share of recall rows asked after a stretch standing for generated text",
    )
    p.add_argument(
        "--copy-steps", type=int, default=0, help="first steps on repeated random strings"
    )
    p.add_argument("--checkpoint-every", type=float, default=10.0, help="minutes (0: never)")
    p.add_argument(
        "--checkpoint-dir", type=Path, default=None, help="default: <out>.checkpoint beside --out"
    )
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint-dir")
    args = p.parse_args(argv)
    if args.minutes <= 0 and args.steps is None:
        raise SystemExit(f"--minutes must be > 0, got {args.minutes}")
    if args.steps is not None and args.steps < 1:
        raise SystemExit(f"--steps must be >= 1, got {args.steps}")
    if not 0.0 <= args.long_fraction <= 1.0:
        raise SystemExit(f"--long-fraction must be in [0, 1], got {args.long_fraction}")
    if args.batch_tokens < LONG_LEN:
        raise SystemExit(f"--batch-tokens must be >= {LONG_LEN}, got {args.batch_tokens}")
    if not 0.0 <= args.recall_fraction <= 1.0:
        raise SystemExit(f"--recall-fraction must be in [0, 1], got {args.recall_fraction}")
    if not 0.0 <= args.recall_stretch_fraction <= 1.0:
        raise SystemExit(
            f"--recall-stretch-fraction must be in [0, 1], got {args.recall_stretch_fraction}"
        )
    lengths = args.recall_lengths.split(",")
    if not all(n.isdigit() and int(n) in TRAINING_LENGTHS for n in lengths):
        raise SystemExit(
            f"--recall-lengths must be a comma-separated list of {TRAINING_LENGTHS}, "
            f"got {args.recall_lengths!r}"
        )
    args.recall_lengths = [int(n) for n in lengths]
    args.recall_tasks = args.recall_tasks.split(",")
    if not set(args.recall_tasks) <= set(TASKS):
        raise SystemExit(
            f"--recall-tasks must be a comma-separated list of {TASKS}, got {args.recall_tasks}"
        )
    if args.copy_steps < 0:
        raise SystemExit(f"--copy-steps must be >= 0, got {args.copy_steps}")
    if args.recall_weight < 0:
        raise SystemExit(f"--recall-weight must be >= 0, got {args.recall_weight}")
    if args.checkpoint_every < 0:
        raise SystemExit(f"--checkpoint-every must be >= 0, got {args.checkpoint_every}")
    if args.checkpoint_dir is None:
        args.checkpoint_dir = args.out.with_name(args.out.name + ".checkpoint")
    return args


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    def log(message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)

    train_files, held_files = split_files()
    stream = training_stream(train_files, args.seed)
    stats = {
        "train_bytes": stream.numel(),
        "held_bytes": sum(len(read_bytes(f)) for f in held_files),
    }
    log(f"{len(train_files)} train files ({stats['train_bytes']:,} B), {len(held_files)} held out")

    runs: list[dict] = []
    state_file = args.checkpoint_dir / "state.pt"
    resume = None
    if args.resume:
        if not state_file.is_file():
            raise FileNotFoundError(f"--resume: no checkpoint at {state_file}")
        resume = torch.load(state_file, weights_only=False)
        if resume["argv"] != run_argv(argv):
            raise ValueError(
                f"--resume: the checkpoint was written by {command_line(resume['argv'])!r}; "
                f"pass the same arguments (plus --resume), got {command_line(run_argv(argv))!r}"
            )
    if args.init is not None:
        recipe = args.init / "recipe.json"
        if not recipe.is_file():
            raise FileNotFoundError(
                f"--init {args.init}: no recipe.json there; continue only from a folder this "
                "script wrote, so that the model card can list every run that made it"
            )
        runs = json.loads(recipe.read_text())
        model = Qwen3ForCausalLM.from_pretrained(args.init, dtype=torch.float32)
        config = model.config
        log(f"continuing from {args.init} ({len(runs)} earlier run(s))")
    else:
        config = Qwen3Config(**MODEL_SHAPE)
        model = Qwen3ForCausalLM(config)
    if resume is not None:
        model.load_state_dict(resume["model"])
        runs = resume["earlier_runs"]
    n_params = sum(p.numel() for p in model.parameters())
    log(f"{n_params:,} parameters; training for {args.steps or f'{args.minutes} min'}")

    # Followed on validation text and families: what the run is judged on stays unseen.
    monitor = held_out_recall(
        RECALL_MONITOR_ITEMS, (LONG_LEN,), ("train", "validation"), "validation"
    )

    def checkpoint(state: dict) -> None:
        state |= {"model": model.state_dict(), "earlier_runs": runs, "argv": run_argv(argv)}
        save_checkpoint(args.checkpoint_dir, state)
        accuracy = recall_line(evaluate_recall(model, monitor))
        log(f"checkpoint {state_file}; held-out recall {accuracy}")

    done = train(model, stream, args, log, resume, checkpoint)
    log(f"trained {done.tokens:,} tokens in {done.seconds / 60:.1f} min; evaluating")
    report = evaluate(model, held_out_sequences(held_files, args.eval_seqs))
    report["recall"] = evaluate_recall(model, held_out_recall(RECALL_EVAL_ITEMS))
    log(f"held-out NLL {report['nll']:.4f} nats/byte, accuracy {report['accuracy']:.4f}")
    for b in report["buckets"]:
        log(f"  positions {b['positions']}: NLL {b['nll']:.4f}, accuracy {b['accuracy']:.4f}")
    alone = report["last_bucket_alone"]
    log(f"  last bucket alone: NLL {alone['nll']:.4f}, accuracy {alone['accuracy']:.4f}")
    log(f"held-out recall exact match: {recall_line(report['recall'])}")
    report["recall_decode"] = evaluate_decode_recall(model, RECALL_DECODE_ITEMS)
    log(f"held-out recall exact match, decode protocol: {recall_line(report['recall_decode'])}")

    split = {
        "rule": f"held out iff int(sha256(relative POSIX path).hexdigest(), 16) % "
        f"{HELD_OUT_MODULUS} == 0",
        "stdlib": str(stdlib_dir()),
        "python": platform.python_version(),
        "train": train_files,
        "held_out": held_files,
    }
    runs.append(this_run(args, argv, done))
    card = model_card(args, config, n_params, (train_files, held_files), runs, report, stats)
    save(model, args.out, card, split, runs)
    log(f"saved {args.out}")


if __name__ == "__main__":
    main()
