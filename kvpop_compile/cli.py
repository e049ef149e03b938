"""The ``kvpop-compile`` command line.

Every mistake a user can make on it ends in one line on stderr naming the bad value and what is
allowed, and exit status 2: arguments are checked as they are parsed (before a model loads), and
the errors the library raises for bad input are printed, not traced back.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Callable
from pathlib import Path

from .embedded.recall import CONTEXT_LENGTHS
from .evaluation.recall import RECALL_PROTOCOLS


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (``prog: message``), like the library's."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message}\n")


def _integer(minimum: int) -> Callable[[str], int]:
    """argparse type: an integer ``>= minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {text!r}")
        return value

    return parse


def _number(*, positive: bool) -> Callable[[str], float]:
    """argparse type: a finite number, ``> 0`` if ``positive`` else ``>= 0``."""
    bound = "> 0" if positive else ">= 0"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < 0 or (positive and value == 0):
            raise argparse.ArgumentTypeError(f"must be a finite number {bound}, got {text!r}")
        return value

    return parse


def _checkpoint(text: str) -> str:
    """argparse type: a local Hugging Face checkpoint folder (never a hub name: nothing is
    downloaded)."""
    folder = Path(text)
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a folder; give a local Hugging Face checkpoint folder "
            "(config.json and the weights)"
        )
    if not (folder / "config.json").is_file():
        raise argparse.ArgumentTypeError(
            f"{text!r} has no config.json; give a local Hugging Face checkpoint folder "
            "(config.json and the weights)"
        )
    return text


def _eval_data(text: str) -> str:
    """argparse type: ``eval --data``, an existing file or folder."""
    if not Path(text).exists():
        raise argparse.ArgumentTypeError(
            f"{text!r} does not exist; give a text file, a folder of text files or a .jsonl of "
            "prompt/answer records"
        )
    return text


def _contexts(text: str) -> tuple[int, ...]:
    """argparse type: prompt lengths such as ``8k,32k`` (k = 1024 tokens)."""
    from .evaluation.long_context import parse_contexts

    try:
        return parse_contexts(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _methods(text: str) -> tuple[str, ...]:
    """argparse type: benchmark methods, comma-separated."""
    from .evaluation.long_context import METHODS

    methods = tuple(item.strip() for item in text.split(","))
    for method in methods:
        if method not in METHODS:
            raise argparse.ArgumentTypeError(
                f"unknown method {method!r}; choose from {', '.join(METHODS)}"
            )
    return methods


def _choices(allowed: tuple, kind: Callable) -> Callable[[str], tuple]:
    """argparse type: a comma-separated subset of ``allowed``, each read with ``kind``."""

    def parse(text: str) -> tuple:
        chosen = []
        for item in text.split(","):
            try:
                value = kind(item.strip())
            except ValueError:
                value = None
            if value not in allowed:
                raise argparse.ArgumentTypeError(
                    f"{item.strip()!r} is not one of {', '.join(map(str, allowed))}"
                )
            chosen.append(value)
        return tuple(chosen)

    return parse


def _device(text: str) -> str:
    """argparse type: ``cpu``, ``cuda`` or ``cuda:N``, refused when CUDA is not available."""
    if text != "cpu" and not re.fullmatch(r"cuda(:\d+)?", text):
        raise argparse.ArgumentTypeError(f"must be cuda, cuda:N or cpu, got {text!r}")
    if text.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise argparse.ArgumentTypeError(
                f"{text!r} is not available here (torch.cuda.is_available() is False); use "
                "--device cpu"
            )
    return text


def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    result = run_demo(
        items=args.items, context=args.context, model_path=args.model, scorer=args.scorer,
        policy=args.policy, capacity=args.capacity, image=None if args.no_image else args.image,
    )  # fmt: skip
    for line in result.report():
        print(line)
    return 0


def _eval(args: argparse.Namespace) -> int:
    import json

    from .evaluation import write_report

    out = Path(args.out)
    if args.report_only:
        saved = out / "quality.json"
        if not saved.is_file():
            raise FileNotFoundError(
                f"{saved} not found: run kvpop-compile eval without --report-only first"
            )
        result = write_report(json.loads(saved.read_text()), out, plots=not args.no_plots)
        print(result["document"])
        print(f"wrote {out / 'quality.md'} and {out / 'quality.json'}")
        return 0
    if args.recall and args.data is not None:
        raise ValueError(
            f"--recall asks the built-in recall items, --data {args.data} gives your own: drop "
            "--recall, and give your questions as a .jsonl of prompt/answer records"
        )
    from .evaluation.methods import methods, runnable_policies

    # Trained scorers are at hand for the embedded model (shipped) or with --scorers.
    policies, notes = runnable_policies(
        None if args.policies is None else tuple(args.policies),
        scorers=args.model is None or args.scorers is not None,
    )
    if not args.recall:  # the recall items have lengths of their own
        methods(policies, args.budgets, args.length)  # a length too short, before the model loads
    if args.model is None:
        from .embedded import load_embedded_model

        model, name = load_embedded_model(), "the embedded model"
    else:
        from .evaluation.own_data import load_checkpoint

        model, name = load_checkpoint(args.model), args.model
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    if args.data is not None:
        return _eval_own_data(args, model, name, out, policies, notes)
    if model.config.vocab_size != 256:
        raise ValueError(
            f"--model {args.model}: the held-out sequences are UTF-8 bytes, so they need a "
            f"byte-level model (vocab_size 256), got vocab_size {model.config.vocab_size}; give "
            "--data with text of your own to read it with the model's tokenizer"
        )
    if args.recall:
        return _eval_recall(args, model, name, out, policies, notes)
    from .evaluation import held_out_sequences

    data = held_out_sequences(args.sequences, length=args.length)
    return _eval_sequences(
        args, model, name, out, data, policies, {"run_notes": notes} if notes else {}
    )


def _eval_sequences(
    args: argparse.Namespace, model, name: str, out: Path, data: list, policies, about: dict
) -> int:
    """The quality benchmark on the sequences ``data``; ``about`` joins the report."""
    from .evaluation import EvalSettings, evaluate_sequences
    from .evaluation.data import default_prompt_length

    length = data[0].ids.numel() - 1
    prompt_length = args.prompt_length or default_prompt_length(length)
    settings = EvalSettings(
        batch=args.batch, protocols=tuple(args.protocols), prompt_length=prompt_length,
        threads=args.threads,
    )  # fmt: skip
    result = evaluate_sequences(
        model, out, data, policies=policies, budgets=args.budgets, settings=settings,
        scorer_root=args.scorers, model_name=name, about=about,
        plots=not args.no_plots,
    )  # fmt: skip
    print(result["document"])
    print(f"wrote {out / 'quality.md'} and {out / 'quality.json'}")
    return 0


def _eval_own_data(
    args: argparse.Namespace, model, name: str, out: Path, policies, notes: list[str]
) -> int:
    """``--data``: text through the quality benchmark, a .jsonl through exact-match answers."""
    from .evaluation.methods import methods
    from .evaluation.own_data import UTF8_BYTES, is_answers, model_tokenizer, text_sequences

    vocab_size = model.config.vocab_size
    if args.model is not None:
        tokenizer = model_tokenizer(args.model, vocab_size)
    else:
        tokenizer = UTF8_BYTES  # the embedded model is byte-level and has no tokenizer files
    if is_answers(args.data):
        from .evaluation.answers import evaluate_answers
        from .evaluation.own_data import answer_items

        items = answer_items(args.data, tokenizer, model.config.max_position_embeddings)
        result = evaluate_answers(
            model, out, items, methods=methods(policies, args.budgets, args.length),
            batch=args.batch, scorer_root=args.scorers, model_name=name,
            data=f"`{args.data}`", tokenizer=None if tokenizer.byte_tokens else tokenizer.name,
            notes=notes,
        )  # fmt: skip
        print(result["document"])
        print(f"wrote {out / 'answers.md'} and {out / 'answers.json'}")
        return 0
    text = text_sequences(args.data, tokenizer, args.length, args.sequences)
    about = {
        "data": text.description,
        "tokenizer": None if tokenizer.byte_tokens else tokenizer.name,
        "run_notes": [*notes, *text.notes],
    }
    return _eval_sequences(args, model, name, out, text.sequences, policies, about)


def _eval_recall(args: argparse.Namespace, model, name: str, out: Path, policies, notes) -> int:
    from .evaluation.methods import methods
    from .evaluation.recall import RecallSettings
    from .evaluation.recall_report import evaluate_recall

    settings = RecallSettings(
        items=args.recall_items, batch=args.batch, lengths=args.recall_lengths,
        protocols=args.recall_protocols,
    )  # fmt: skip
    result = evaluate_recall(
        model, out, methods=methods(policies, args.budgets), settings=settings,
        scorer_root=args.scorers, model_name=name,
    )  # fmt: skip
    print(result["document"])
    for note in notes:
        print(note)
    print(f"wrote {out / 'recall.md'} and {out / 'recall.json'}")
    return 0


def _bench(args: argparse.Namespace) -> int:
    import torch

    from .config import KVpopConfig
    from .evaluation.long_context import BenchSettings, bench_model, run_bench
    from .evaluation.long_context_report import bench_setup, bench_table, write_bench

    if args.layers is not None and args.model is not None:
        raise ValueError(
            f"--layers {args.layers} cuts a --shape model; a --model checkpoint runs all its layers"
        )
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.threads:
        torch.set_num_threads(args.threads)
    config = KVpopConfig(
        sinks=args.sinks, window=args.window, topk=args.topk, lam=args.lam, scorer=args.scorer
    )
    settings = BenchSettings(
        contexts=tuple(n for group in args.contexts for n in group),
        methods=tuple(m for group in args.methods for m in group),
        decode_tokens=args.decode_tokens, warmup=args.warmup, kvpop=config,
    )  # fmt: skip
    model, name = bench_model(
        path=args.model, shape=args.shape, layers=args.layers, dtype=args.dtype, device=device,
        settings=settings,
    )  # fmt: skip
    result = run_bench(model, settings, model_name=name)
    files = write_bench(result, args.out)
    print(bench_setup(result), bench_table(result), sep="\n\n")
    print(f"wrote {', '.join(str(f) for f in files)}")
    return 0


def _export(args: argparse.Namespace) -> int:
    from transformers import AutoModelForCausalLM

    from . import export, load_scorer, transform
    from .config import KVpopConfig

    config = KVpopConfig(
        sinks=args.sinks, window=args.window, topk=args.topk, lam=args.lam, scorer=args.scorer
    )
    model = AutoModelForCausalLM.from_pretrained(args.model, attn_implementation="sdpa")
    model = transform(model.eval(), config)
    if args.scorer_path:
        load_scorer(model, args.scorer_path)
    folder = export(
        model, args.out, args.format, batch=args.batch, prefill_length=args.prefill_length
    )
    print(f"wrote {args.format} engine to {folder}")
    return 0


def _train(args: argparse.Namespace) -> int:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .config import KVpopConfig
    from .training import train_scorer

    config = KVpopConfig(
        sinks=args.sinks, window=args.window, topk=args.topk, lam=args.lam, scorer=args.scorer
    )
    model = AutoModelForCausalLM.from_pretrained(args.model, attn_implementation="sdpa")
    tokenizer = None
    if args.tokenizer == "model":
        encode = AutoTokenizer.from_pretrained(args.model)
        tokenizer = lambda text: encode(text)["input_ids"]  # noqa: E731
    report = train_scorer(
        model, args.data, config, output_dir=args.out, steps=args.steps, seq_len=args.seq_len,
        batch_size=args.batch_size, lr=args.lr, loss=args.loss, target=args.target,
        tokenizer=tokenizer, eval_every=args.eval_every, checkpoint_every=args.checkpoint_every,
    )  # fmt: skip
    for evaluation in report.evaluations:
        print(
            f"step {evaluation['step']}: held-out loss {evaluation['loss']:.4f}, "
            f"ranking accuracy {evaluation['accuracy']:.3f}"
        )
    print(f"wrote scorer to {report.scorer_path}")
    return 0


def _budget_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sinks", type=_integer(0), default=4)
    parser.add_argument("--window", type=_integer(1), default=256)
    parser.add_argument("--topk", type=_integer(0), default=3836)
    parser.add_argument("--lam", type=_number(positive=False), default=0.0)
    parser.add_argument("--scorer", default="memory", help="policy (default memory)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="kvpop-compile", description="Bounded KV cache with a learned policy for Qwen3."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser(
        "demo",
        help="a held-out recall question: full attention, KVpop and a heuristic at one budget",
    )
    demo.add_argument(
        "--items", type=_integer(1), default=8, help="held-out recall items per task (8)"
    )
    demo.add_argument(
        "--context", type=_integer(1), default=2048, help="item length in tokens: 1024 or 2048"
    )
    demo.add_argument(
        "--model",
        type=_checkpoint,
        help="local byte-level Qwen3 checkpoint folder (default: the embedded one)",
    )
    demo.add_argument("--scorer", help="trained scorer folder (save_scorer / kvpop-compile train)")
    demo.add_argument(
        "--policy", default="window",
        help="the heuristic compared at KVpop's budget: window (default), random, knorm, h2o, tova",
    )  # fmt: skip
    demo.add_argument(
        "--capacity", type=_integer(1), default=256,
        help="tokens kept per layer and KV head, choosing the shipped scorer (256 or 512)",
    )  # fmt: skip
    demo.add_argument("--image", default="kvpop_demo.png", help="PNG of what the caches hold")
    demo.add_argument("--no-image", action="store_true", help="do not draw the PNG")
    demo.set_defaults(run=_demo)

    evaluator = commands.add_parser(
        "eval", help="quality benchmark: every policy against full attention on held-out text"
    )
    from .evaluation import BUDGETS, POLICIES, PROTOCOLS, SEQUENCE_LENGTH

    evaluator.add_argument(
        "--data", type=_eval_data,
        help="your own text instead of the held-out files: a text file, a folder of text files "
        "(recursive; binary files skipped), or a .jsonl of {\"prompt\", \"answer\"} records "
        "for exact-match answers",
    )  # fmt: skip
    evaluator.add_argument(
        "--sequences", type=_integer(1), default=64, help="sequences, at most (64)"
    )
    evaluator.add_argument(
        "--length", type=_integer(2), default=SEQUENCE_LENGTH,
        help=f"tokens per sequence; the budgets keep 1/4 and 1/8 of it ({SEQUENCE_LENGTH})",
    )  # fmt: skip
    evaluator.add_argument(
        "--policies", nargs="+", choices=POLICIES,
        help="default: all; with --model and no --scorers, the heuristic ones",
    )  # fmt: skip
    evaluator.add_argument("--budgets", nargs="+", default=list(BUDGETS), choices=list(BUDGETS))
    evaluator.add_argument("--protocols", nargs="+", default=list(PROTOCOLS), choices=PROTOCOLS)
    evaluator.add_argument(
        "--prompt-length", type=_integer(1),
        help="prompt of the continuation and compression protocols (3/4 of --length: 1536)",
    )  # fmt: skip
    evaluator.add_argument(
        "--batch", type=_integer(1), default=16, help="sequences per forward (16)"
    )
    evaluator.add_argument(
        "--model", type=_checkpoint,
        help="local Qwen3 checkpoint folder, read with its own tokenizer (or as UTF-8 bytes if "
        "it is byte-level and has none); default: the embedded model",
    )  # fmt: skip
    evaluator.add_argument("--scorers", help="trained scorers, <policy>-<capacity>/ folders")
    evaluator.add_argument("--out", default="benchmarks/results", help="results folder")
    evaluator.add_argument("--threads", type=_integer(1), help="torch threads (default: torch's)")
    evaluator.add_argument("--no-plots", action="store_true", help="tables only (no matplotlib)")
    evaluator.add_argument(
        "--report-only", action="store_true",
        help="rewrite quality.md and the plots from the saved quality.json (and kvpress.json)",
    )  # fmt: skip
    evaluator.add_argument(
        "--recall", action="store_true",
        help="run the long-range recall protocol instead (recall.md, recall.json)",
    )  # fmt: skip
    evaluator.add_argument(
        "--recall-items", type=_integer(1), default=64,
        help="held-out recall items per task and length (64)",
    )  # fmt: skip
    evaluator.add_argument(
        "--recall-lengths", type=_choices(CONTEXT_LENGTHS, int), default=CONTEXT_LENGTHS,
        help="item lengths in bytes, comma-separated (1024,2048)",
    )  # fmt: skip
    evaluator.add_argument(
        "--recall-protocols", type=_choices(RECALL_PROTOCOLS, str), default=RECALL_PROTOCOLS,
        help="prefill (the prompt compressed) and/or decode (the question after a generated "
        "stretch), comma-separated (both)",
    )  # fmt: skip
    evaluator.set_defaults(run=_eval)

    bench = commands.add_parser(
        "bench",
        help="long-context prefill and decode on this machine: transformers' caches against KVpop",
    )
    from .evaluation.long_context import DEFAULT_METHODS
    from .evaluation.model_shapes import MODELS

    model = bench.add_mutually_exclusive_group(required=True)
    model.add_argument("--model", type=_checkpoint, help="local Qwen3 checkpoint folder")
    model.add_argument(
        "--shape", choices=list(MODELS), help="a released Qwen3's shape with random weights"
    )
    bench.add_argument(
        "--layers", type=_integer(1), help="with --shape: this many layers (default: the model's)"
    )
    bench.add_argument("--device", type=_device, help="cuda or cpu (default: cuda when available)")
    bench.add_argument(
        "--dtype", choices=["float32", "bfloat16", "float16"],
        help="weights and cache (default: bfloat16 on CUDA, float32 on the CPU)",
    )  # fmt: skip
    bench.add_argument(
        "--contexts", type=_contexts, nargs="+", default=[(8192, 32768)],
        help="prompt lengths, k = 1024 (default 8k,32k)",
    )  # fmt: skip
    bench.add_argument(
        "--methods", type=_methods, nargs="+", default=[DEFAULT_METHODS],
        help=f"of dynamic, static, eager, compile, aoti (default {','.join(DEFAULT_METHODS)})",
    )  # fmt: skip
    bench.add_argument(
        "--decode-tokens", type=_integer(1), default=16, help="timed decode steps (16)"
    )
    bench.add_argument(
        "--warmup", type=_integer(1), default=3, help="untimed decode steps before them (3)"
    )
    _budget_arguments(bench)
    bench.add_argument("--threads", type=_integer(1), help="torch threads (default: torch's)")
    bench.add_argument("--out", default="kvpop_bench", help="results folder (kvpop_bench)")
    bench.set_defaults(run=_bench)

    exporter = commands.add_parser("export", help="transform a local Qwen3 and export an engine")
    exporter.add_argument(
        "--model", required=True, type=_checkpoint, help="local Hugging Face checkpoint folder"
    )
    exporter.add_argument("--out", required=True, help="engine folder to write")
    exporter.add_argument("--format", default="aoti", choices=["aoti", "onnx", "tensorrt"])
    _budget_arguments(exporter)
    exporter.add_argument("--scorer-path", help="folder written by save_scorer")
    exporter.add_argument(
        "--batch", type=_integer(1), default=1, help="sequences per call (default 1)"
    )
    exporter.add_argument(
        "--prefill-length",
        type=_integer(2),
        help="also export a prefill step for prompts this long",
    )
    exporter.set_defaults(run=_export)

    trainer = commands.add_parser("train", help="train scorers for a local Qwen3 checkpoint")
    trainer.add_argument(
        "--model", required=True, type=_checkpoint, help="local Hugging Face checkpoint folder"
    )
    trainer.add_argument(
        "--data",
        required=True,
        help="folder of .txt/.py files, a .jsonl, or an Arrow dataset (.arrow file or folder)",
    )
    trainer.add_argument("--out", required=True, help="output folder (checkpoint, scorer/)")
    _budget_arguments(trainer)
    trainer.add_argument("--steps", type=_integer(1), default=200)
    trainer.add_argument("--seq-len", type=_integer(2), default=512)
    trainer.add_argument("--batch-size", type=_integer(1), default=4)
    trainer.add_argument("--lr", type=_number(positive=True), default=1e-3)
    trainer.add_argument("--loss", default="boundary", choices=["boundary", "regression",
                         "quantile"])  # fmt: skip
    trainer.add_argument(
        "--target", default="mean", choices=["mean", "max"],
        help="what a token's future attention is reduced to over later queries: the mean "
        "(default) or the strongest single query (keeps what one later question needs)",
    )  # fmt: skip
    trainer.add_argument("--eval-every", type=_integer(1), default=50)
    trainer.add_argument("--checkpoint-every", type=_integer(1), default=50)
    trainer.add_argument(
        "--tokenizer", default="model", choices=["model", "bytes"],
        help="the checkpoint's tokenizer (default) or UTF-8 bytes for byte-vocabulary models",
    )  # fmt: skip
    trainer.set_defaults(run=_train)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
