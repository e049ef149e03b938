"""The ``kvpop-compile`` argument parser: its subcommands, their options and defaults, and
:func:`main`, which runs one and turns the errors bad input raises into one line on stderr."""

from __future__ import annotations

import argparse
import sys

from ..embedded.recall import CONTEXT_LENGTHS
from ..embedded.recall_syntax import FAMILY_SPLITS
from ..evaluation.recall import RECALL_FAMILIES, RECALL_PROTOCOLS
from ..vllm.serve import add_arguments as add_serve_arguments
from ..vllm.serve import serve_command
from .arguments import (
    Parser,
    bench_methods,
    checkpoint_folder,
    comma_choices,
    contexts,
    device,
    eval_data,
    integer,
    number,
)
from .commands import bench_command, demo_command, eval_command, export_command, train_command


def model_argument(parser: argparse.ArgumentParser) -> None:
    """``--model``: the local checkpoint a command transforms."""
    parser.add_argument(
        "--model",
        required=True,
        type=checkpoint_folder,
        help="local Hugging Face checkpoint folder",
    )


def budget_arguments(parser: argparse.ArgumentParser) -> None:
    """The policy's budget: sinks, window, top-k, position weight, scorer and score span
    (:func:`~.arguments.config_from_arguments` reads them)."""
    parser.add_argument("--sinks", type=integer(0), default=4)
    parser.add_argument("--window", type=integer(1), default=256)
    parser.add_argument("--topk", type=integer(0), default=3836)
    parser.add_argument("--lam", type=number(positive=False), default=0.0)
    parser.add_argument("--scorer", default="memory", help="policy (default memory)")
    parser.add_argument(
        "--priority-span", type=integer(0), default=0,
        help="a token's score also counts for the P tokens that leave the window after it "
        "(default 0: off)",
    )  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="kvpop-compile", description="Bounded KV cache with a learned policy for Qwen3."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser(
        "demo",
        help="a held-out recall question: full attention, KVpop and a heuristic at one budget",
    )
    demo.add_argument(
        "--items", type=integer(1), default=8,
        help="recall items per task, of held-out code in held-out families (8)",
    )  # fmt: skip
    demo.add_argument(
        "--context", type=integer(1), default=2048, help="item length in tokens: 1024 or 2048"
    )
    demo.add_argument(
        "--model",
        type=checkpoint_folder,
        help="local byte-level Qwen3 checkpoint folder (default: the embedded one)",
    )
    demo.add_argument("--scorer", help="trained scorer folder (save_scorer / kvpop-compile train)")
    demo.add_argument(
        "--policy", default="window",
        help="the heuristic compared at KVpop's budget: window (default), random, knorm, h2o, tova",
    )  # fmt: skip
    demo.add_argument(
        "--capacity", type=integer(1), default=256,
        help="tokens kept per layer and KV head, choosing the shipped scorer (256 or 512)",
    )  # fmt: skip
    demo.add_argument("--image", default="kvpop_demo.png", help="PNG of what the caches hold")
    demo.add_argument("--no-image", action="store_true", help="do not draw the PNG")
    demo.set_defaults(run=demo_command)

    evaluator = commands.add_parser(
        "eval", help="quality benchmark: every policy against full attention on held-out text"
    )
    from ..evaluation import BUDGETS, POLICIES, PROTOCOLS, SEQUENCE_LENGTH

    evaluator.add_argument(
        "--data", type=eval_data,
        help="your own text instead of the held-out files: a text file, a folder of text files "
        "(recursive; binary files skipped), or a .jsonl of {\"prompt\", \"answer\"} records "
        "for exact-match answers",
    )  # fmt: skip
    evaluator.add_argument(
        "--sequences", type=integer(1), default=64, help="sequences, at most (64)"
    )
    evaluator.add_argument(
        "--length", type=integer(2), default=SEQUENCE_LENGTH,
        help=f"tokens per sequence; the budgets keep 1/4 and 1/8 of it ({SEQUENCE_LENGTH})",
    )  # fmt: skip
    evaluator.add_argument(
        "--policies", nargs="+", choices=POLICIES,
        help="default: all; with --model and no --scorers, the heuristic ones",
    )  # fmt: skip
    evaluator.add_argument("--budgets", nargs="+", default=list(BUDGETS), choices=list(BUDGETS))
    evaluator.add_argument("--protocols", nargs="+", default=list(PROTOCOLS), choices=PROTOCOLS)
    evaluator.add_argument(
        "--prompt-length", type=integer(1),
        help="prompt of the continuation and compression protocols (3/4 of --length: 1536)",
    )  # fmt: skip
    evaluator.add_argument(
        "--batch", type=integer(1), default=16, help="sequences per forward (16)"
    )
    evaluator.add_argument(
        "--model", type=checkpoint_folder,
        help="local Qwen3 checkpoint folder, read with its own tokenizer (or as UTF-8 bytes if "
        "it is byte-level and has none); default: the embedded model",
    )  # fmt: skip
    evaluator.add_argument("--scorers", help="trained scorers, <policy>-<capacity>/ folders")
    evaluator.add_argument(
        "--priority-span", type=integer(0), default=None,
        help="spread each learned score over the P tokens that leave the window after it "
        "(default: the span each trained scorer was saved with; the heuristics run as "
        "published)",
    )  # fmt: skip
    evaluator.add_argument("--out", default="benchmarks/results", help="results folder")
    evaluator.add_argument("--threads", type=integer(1), help="torch threads (default: torch's)")
    evaluator.add_argument("--no-plots", action="store_true", help="tables only (no matplotlib)")
    evaluator.add_argument(
        "--report-only", action="store_true",
        help="rewrite quality.md and the plots from the saved quality.json (and kvpress.json); "
        "with --recall, recall.md from recall.json (and kvpress_recall.json)",
    )  # fmt: skip
    evaluator.add_argument(
        "--recall", action="store_true",
        help="run the long-range recall protocol instead (recall.md, recall.json)",
    )  # fmt: skip
    evaluator.add_argument(
        "--resume", action="store_true",
        help="with --recall: keep the methods already in OUT/recall.json (saved after each "
        "method) when it was run with the same items, lengths, protocols and model, and run only "
        "the others, so a cut-off run goes on where it stopped and other --policies add rows",
    )  # fmt: skip
    evaluator.add_argument(
        "--recall-items", type=integer(1), default=64,
        help="recall items of held-out code per family group, task and length (64)",
    )  # fmt: skip
    evaluator.add_argument(
        "--recall-families", type=comma_choices(FAMILY_SPLITS, str), default=RECALL_FAMILIES,
        help="family groups of the items (binding and question syntaxes, value alphabets), "
        f"comma-separated, of {', '.join(FAMILY_SPLITS)}: train, the ones models and scorers "
        "are trained on; held_out, ones no training step saw; validation, the ones scorers are "
        f"chosen on ({','.join(RECALL_FAMILIES)})",
    )  # fmt: skip
    evaluator.add_argument(
        "--recall-lengths", type=comma_choices(CONTEXT_LENGTHS, int), default=CONTEXT_LENGTHS,
        help="item lengths in bytes, comma-separated (1024,2048)",
    )  # fmt: skip
    evaluator.add_argument(
        "--recall-protocols", type=comma_choices(RECALL_PROTOCOLS, str), default=RECALL_PROTOCOLS,
        help="prefill (the prompt compressed) and/or decode (the question after a generated "
        "stretch), comma-separated (both)",
    )  # fmt: skip
    evaluator.set_defaults(run=eval_command)

    bench = commands.add_parser(
        "bench",
        help="long-context prefill and decode on this machine: transformers' caches against KVpop",
    )
    from ..evaluation.long_context_settings import DEFAULT_METHODS
    from ..evaluation.model_shapes import MODELS

    model = bench.add_mutually_exclusive_group(required=True)
    model.add_argument("--model", type=checkpoint_folder, help="local Qwen3 checkpoint folder")
    model.add_argument(
        "--shape", choices=list(MODELS), help="a released Qwen3's shape with random weights"
    )
    bench.add_argument(
        "--layers", type=integer(1), help="with --shape: this many layers (default: the model's)"
    )
    bench.add_argument("--device", type=device, help="cuda or cpu (default: cuda when available)")
    bench.add_argument(
        "--dtype", choices=["float32", "bfloat16", "float16"],
        help="weights and cache (default: bfloat16 on CUDA, float32 on the CPU)",
    )  # fmt: skip
    bench.add_argument(
        "--contexts", type=contexts, nargs="+", default=[(8192, 32768)],
        help="prompt lengths, k = 1024 (default 8k,32k)",
    )  # fmt: skip
    bench.add_argument(
        "--methods", type=bench_methods, nargs="+", default=[DEFAULT_METHODS],
        help=f"of dynamic, static, eager, compile, graph, aoti (default "
        f"{','.join(DEFAULT_METHODS)})",
    )  # fmt: skip
    bench.add_argument(
        "--decode-tokens", type=integer(1), default=16, help="timed decode steps (16)"
    )
    bench.add_argument(
        "--warmup", type=integer(1), default=3, help="untimed decode steps before them (3)"
    )
    bench.add_argument(
        "--batch", type=integer(1), default=1,
        help="sequences decoded together, each with its own cache (default 1)",
    )  # fmt: skip
    budget_arguments(bench)
    bench.add_argument("--threads", type=integer(1), help="torch threads (default: torch's)")
    bench.add_argument("--out", default="kvpop_bench", help="results folder (kvpop_bench)")
    bench.set_defaults(run=bench_command)

    exporter = commands.add_parser("export", help="transform a local Qwen3 and export an engine")
    model_argument(exporter)
    exporter.add_argument("--out", required=True, help="engine folder to write")
    exporter.add_argument("--format", default="aoti", choices=["aoti", "onnx", "tensorrt"])
    budget_arguments(exporter)
    exporter.add_argument("--scorer-path", help="folder written by save_scorer")
    exporter.add_argument(
        "--batch", type=integer(1), default=1, help="sequences per call (default 1)"
    )
    exporter.add_argument(
        "--prefill-length",
        type=integer(2),
        help="also export a prefill step for prompts this long",
    )
    exporter.set_defaults(run=export_command)

    trainer = commands.add_parser("train", help="train scorers for a local Qwen3 checkpoint")
    model_argument(trainer)
    trainer.add_argument(
        "--data",
        required=True,
        help="folder of .txt/.py files, a .jsonl, or an Arrow dataset (.arrow file or folder)",
    )
    trainer.add_argument("--out", required=True, help="output folder (checkpoint, scorer/)")
    budget_arguments(trainer)
    trainer.add_argument("--steps", type=integer(1), default=200)
    trainer.add_argument("--seq-len", type=integer(2), default=512)
    trainer.add_argument("--batch-size", type=integer(1), default=4)
    trainer.add_argument("--lr", type=number(positive=True), default=1e-3)
    trainer.add_argument(
        "--loss", default="boundary", choices=["boundary", "gap", "regression", "quantile"],
        help="boundary: pairwise logistic on the policy's decisions (default); gap: the same "
        "pairs weighted by their gap under the target; regression; quantile (BCE)",
    )  # fmt: skip
    trainer.add_argument(
        "--target", default="mean", choices=["mean", "max"],
        help="what a token's future attention is reduced to over later queries: the mean "
        "(default) or the strongest single query (keeps what one later question needs)",
    )  # fmt: skip
    trainer.add_argument(
        "--recall-fraction", type=number(positive=False), default=0.0,
        help="share of the training sequences that are recall items planted in the data's own "
        "text (a key bound to a value, a question about it at the end), in [0, 1); default 0",
    )  # fmt: skip
    trainer.add_argument("--eval-every", type=integer(1), default=50)
    trainer.add_argument("--checkpoint-every", type=integer(1), default=50)
    trainer.add_argument(
        "--init-from", metavar="SCORER_FOLDER",
        help="start from a saved scorer instead of a random draw: the same kind, or an mlp "
        "scorer for --scorer memory (the memory scorer then starts as exactly that mlp)",
    )  # fmt: skip
    trainer.add_argument(
        "--tokenizer", default="model", choices=["model", "bytes"],
        help="the checkpoint's tokenizer (default) or UTF-8 bytes for byte-vocabulary models",
    )  # fmt: skip
    trainer.add_argument(
        "--no-resume", action="store_true",
        help="start over even when OUT holds a checkpoint of an earlier run (it is "
        "overwritten); by default a run goes on from it, with the same settings",
    )  # fmt: skip
    trainer.set_defaults(run=train_command)

    server = commands.add_parser(
        "serve", help="serve a local Qwen3 with vLLM's OpenAI-compatible server (needs vLLM)"
    )
    add_serve_arguments(server)
    server.set_defaults(run=serve_command)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # ``serve … -- OPTIONS``: what follows ``--`` is vLLM's, not ours (argparse's subcommands
    # would refuse it).
    passthrough = []
    if "--" in argv:
        at = argv.index("--")
        argv, passthrough = argv[:at], argv[at + 1 :]
    parser = build_parser()
    args = parser.parse_args(argv)
    if passthrough:
        if args.command != "serve":
            parser.error(f"options after -- go to vLLM's server: only serve takes them, not "
                         f"{args.command}")  # fmt: skip
        args.vllm_options = passthrough
    try:
        return args.run(args)
    # What bad input raises (the library's checks, missing or unreadable files, a missing
    # optional package): one line. Anything else is a bug and keeps its traceback.
    except (ValueError, TypeError, OSError, ImportError) as error:
        print(f"kvpop-compile {args.command}: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"kvpop-compile {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
