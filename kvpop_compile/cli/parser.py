"""The ``kvpop-compile`` argument parser: its subcommands, their options and defaults, and
:func:`main`, which runs one and turns the errors bad input raises into one line on stderr.

One name per meaning across the verbs (docs/cli.md, written from this parser by
``scripts/write_cli_doc.py``, states the rule): a flag that sets a library setting is spelled
like its field and takes its default and choices from the library (``KVpopConfig``,
``ScorerKind``, ``TrainSettings`` and the training enums, the evaluation settings), never
restated here; old spellings stay as deprecated aliases, or are refused with a line naming the
new flag where they would now mean something else.
"""

from __future__ import annotations

import argparse
import sys
from fractions import Fraction

from ..config import KVpopConfig, ScorerKind
from ..embedded.recall import CONTEXT_LENGTHS
from ..embedded.recall_syntax import FAMILY_SPLITS
from ..training.scorer_loss import LossKind
from ..training.settings import TargetKind, TrainSettings
from ..vllm.serve import add_arguments as add_serve_arguments
from ..vllm.serve import serve_command
from .arguments import (
    BUDGET_FIELDS,
    DeprecatedAliases,
    Parser,
    Refused,
    bench_methods,
    checkpoint_folder,
    comma_choices,
    contexts,
    device,
    enum_values,
    eval_data,
    field_default,
    integer,
    number,
    parameter_default,
)
from .commands import bench_command, demo_command, eval_command, export_command, train_command

SCORER_IS_A_KIND = (
    "--scorer names a scorer kind (the policy of a budget: bench, export, train), not a trained "
    "scorer folder"
)
"""Why ``demo`` and ``serve`` refuse their old ``--scorer DIR``."""

LOSS_HELP = {
    LossKind.BOUNDARY: "pairwise logistic on the policy's keep-or-drop decisions",
    LossKind.GAP: "the same pairs weighted by their gap under the target",
    LossKind.REGRESSION: "squared error on the log target",
    LossKind.QUANTILE: "BCE on in-the-top-fraction labels",
}
TARGET_HELP = {
    TargetKind.MEAN: "the mean over the later queries",
    TargetKind.MAX: "the strongest single query (keeps what one later question needs)",
    TargetKind.POWER_MEAN: "the power mean of power --target-power, between the two",
}


def choices_help(described: dict) -> str:
    """``value: what it does; …`` for every member of an enum, in its order (a member without
    a line here is a KeyError as the parser is built, so a new one cannot go undocumented)."""
    kind = type(next(iter(described)))
    return "; ".join(f"{member.value}: {described[member]}" for member in kind)


def flag(name: str) -> str:
    """The flag of a library field: ``priority_span`` -> ``--priority-span``."""
    return "--" + name.replace("_", "-")


def model_argument(parser: argparse.ArgumentParser) -> None:
    """``--model``: the local checkpoint a command transforms."""
    parser.add_argument(
        "--model",
        required=True,
        type=checkpoint_folder,
        help="local Hugging Face checkpoint folder",
    )


def budget_arguments(parser: argparse.ArgumentParser) -> None:
    """The policy's budget: one flag per :data:`~.arguments.BUDGET_FIELDS` field of
    ``KVpopConfig``, with that field's default (``--scorer``: the ``ScorerKind`` values)
    (:func:`~.arguments.config_from_arguments` reads them)."""
    for name, (kind, help) in BUDGET_FIELDS.items():
        choices = enum_values(ScorerKind) if name == "scorer" else None
        parser.add_argument(
            flag(name), type=kind, choices=choices, default=field_default(KVpopConfig, name),
            help=f"{help} (default %(default)s)",
        )  # fmt: skip


def scorer_path_argument(parser, help: str) -> None:
    """``--scorer-path DIR``: one trained scorer folder; the old ``--scorer DIR`` refused."""
    parser.add_argument("--scorer-path", metavar="DIR", help=help)
    parser.add_argument("--scorer", action=Refused, use="--scorer-path", why=SCORER_IS_A_KIND)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="kvpop-compile",
        description="Bounded KV cache with a learned policy for Qwen3.",
        epilog="Every verb and flag, and the naming rule they follow: docs/cli.md.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser(
        "demo",
        help="a held-out recall question: full attention, KVpop and a heuristic at one budget",
    )
    from ..evaluation.demo import run_demo
    from ..evaluation.methods import EMBEDDED_SCORERS

    demo.add_argument(
        "--items", type=integer(1), default=parameter_default(run_demo, "items"),
        help="recall items per task, of held-out code in held-out families (default "
        "%(default)s)",
    )  # fmt: skip
    demo.add_argument(
        "--context", type=integer(1), default=parameter_default(run_demo, "context"),
        help=f"item length in tokens: {' or '.join(map(str, CONTEXT_LENGTHS))} (default "
        "%(default)s)",
    )  # fmt: skip
    demo.add_argument(
        "--model",
        type=checkpoint_folder,
        help="local byte-level Qwen3 checkpoint folder (default: the embedded one)",
    )
    scorer_path_argument(
        demo,
        "trained scorer folder (save_scorer / kvpop-compile train); default: the shipped "
        "memory scorer of --capacity",
    )
    heuristics = [kind.value for kind in ScorerKind if not kind.learned]
    demo.add_argument(
        "--policy", default=parameter_default(run_demo, "policy"),
        help=f"the heuristic compared at KVpop's budget: {', '.join(heuristics)} (default "
        "%(default)s)",
    )  # fmt: skip
    shipped = sorted(int(folder.name.split("-")[1]) for folder in EMBEDDED_SCORERS.glob("memory-*"))
    demo.add_argument(
        "--capacity", type=integer(1), default=parameter_default(run_demo, "capacity"),
        help="tokens kept per layer and KV head, choosing the shipped scorer (shipped: "
        f"{', '.join(map(str, shipped))}; default %(default)s)",
    )  # fmt: skip
    demo.add_argument(
        "--image", default=parameter_default(run_demo, "image"),
        help="PNG of what the caches hold (default %(default)s)",
    )  # fmt: skip
    demo.add_argument("--no-image", action="store_true", help="do not draw the PNG")
    demo.set_defaults(run=demo_command)

    evaluator = commands.add_parser(
        "eval", help="quality benchmark: every policy against full attention on held-out text"
    )
    from ..evaluation import BUDGETS, PROMPT_LENGTH, PROTOCOLS, SEQUENCE_LENGTH, EvalSettings
    from ..evaluation.methods import KEPT_FRACTION
    from ..evaluation.recall import RecallSettings

    evaluator.add_argument(
        "--data", type=eval_data,
        help="your own text instead of the held-out files: a text file, a folder of text files "
        "(recursive; binary files skipped), or a .jsonl of {\"prompt\", \"answer\"} records "
        "for exact-match answers",
    )  # fmt: skip
    evaluator.add_argument(
        "--sequences", type=integer(1), default=64, help="sequences, at most (default %(default)s)"
    )
    kept = " and ".join(f"1/{share}" for share in KEPT_FRACTION.values())
    evaluator.add_argument(
        "--length", type=integer(2), default=SEQUENCE_LENGTH,
        help=f"tokens per sequence; the budgets keep {kept} of it (default %(default)s)",
    )  # fmt: skip
    evaluator.add_argument(
        "--policies", nargs="+", choices=enum_values(ScorerKind),
        help="the policies compared (default: all; with --model and no --scorer-root, the "
        "heuristic ones)",
    )  # fmt: skip
    evaluator.add_argument(
        "--budgets", nargs="+", default=list(BUDGETS), choices=list(BUDGETS),
        help="compression budgets (default: all)",
    )  # fmt: skip
    evaluator.add_argument(
        "--protocols", nargs="+", default=list(PROTOCOLS), choices=PROTOCOLS,
        help="protocols of the quality benchmark (default: all)",
    )  # fmt: skip
    share = Fraction(PROMPT_LENGTH, SEQUENCE_LENGTH)
    evaluator.add_argument(
        "--prompt-length", type=integer(1),
        help="prompt of the continuation and compression protocols (default: "
        f"{share.numerator}/{share.denominator} of --length, {PROMPT_LENGTH} at "
        f"{SEQUENCE_LENGTH})",
    )  # fmt: skip
    evaluator.add_argument(
        "--batch", type=integer(1), default=field_default(EvalSettings, "batch"),
        help="sequences (or recall items) per forward (default %(default)s)",
    )  # fmt: skip
    evaluator.add_argument(
        "--model", type=checkpoint_folder,
        help="local Qwen3 checkpoint folder, read with its own tokenizer (or as UTF-8 bytes if "
        "it is byte-level and has none); default: the embedded model",
    )  # fmt: skip
    evaluator.add_argument(
        "--scorer-root", "--scorers", metavar="DIR", action=DeprecatedAliases,
        deprecated=["--scorers"],
        help="folder of trained scorers, one <policy>-<capacity>/ folder each (default: the "
        "shipped ones, for the embedded model)",
    )  # fmt: skip
    evaluator.add_argument(
        "--priority-span", type=integer(0), default=None,
        help="spread each learned score over the P tokens that leave the window after it "
        "(default: the span each trained scorer was saved with; the heuristics run as "
        "published)",
    )  # fmt: skip
    evaluator.add_argument(
        "--out", default="kvpop_eval",
        help="results folder, relative to the current directory (default %(default)s)",
    )  # fmt: skip
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
        "--recall-items", type=integer(1), default=field_default(RecallSettings, "items"),
        help="recall items of held-out code per family group, task and length (default "
        "%(default)s)",
    )  # fmt: skip
    families = field_default(RecallSettings, "families")
    evaluator.add_argument(
        "--recall-families", type=comma_choices(FAMILY_SPLITS, str), default=families,
        help="family groups of the items (binding and question syntaxes, value alphabets), "
        f"comma-separated, of {', '.join(FAMILY_SPLITS)}: train, the ones models and scorers "
        "are trained on; held_out, ones no training step saw; validation, the ones scorers are "
        f"chosen on (default {','.join(families)})",
    )  # fmt: skip
    lengths = field_default(RecallSettings, "lengths")
    evaluator.add_argument(
        "--recall-lengths", type=comma_choices(CONTEXT_LENGTHS, int), default=lengths,
        help=f"item lengths in bytes, comma-separated (default {','.join(map(str, lengths))})",
    )  # fmt: skip
    protocols = field_default(RecallSettings, "protocols")
    evaluator.add_argument(
        "--recall-protocols", type=comma_choices(protocols, str), default=protocols,
        help="prefill (the prompt compressed) and/or decode (the question after a generated "
        f"stretch), comma-separated (default {','.join(protocols)})",
    )  # fmt: skip
    evaluator.set_defaults(run=eval_command)

    bench = commands.add_parser(
        "bench",
        help="long-context prefill and decode on this machine: transformers' caches against KVpop",
    )
    from ..evaluation.bench import DTYPES, METHODS, MODELS, BenchSettings, context_label

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
        "--dtype", choices=list(DTYPES),
        help="weights and cache (default: bfloat16 on CUDA, float32 on the CPU)",
    )  # fmt: skip
    prompts = (8192, 32768)
    bench.add_argument(
        "--contexts", type=contexts, nargs="+", default=[prompts],
        help="prompt lengths, comma-separated, k = 1024 (default "
        f"{','.join(map(context_label, prompts))})",
    )  # fmt: skip
    methods = field_default(BenchSettings, "methods")
    bench.add_argument(
        "--methods", type=bench_methods, nargs="+", default=[methods],
        help=f"how the caches run, comma-separated, of {', '.join(METHODS)} (default "
        f"{','.join(methods)})",
    )  # fmt: skip
    bench.add_argument(
        "--decode-tokens", type=integer(1), default=field_default(BenchSettings, "decode_tokens"),
        help="timed decode steps (default %(default)s)",
    )  # fmt: skip
    bench.add_argument(
        "--warmup", type=integer(1), default=field_default(BenchSettings, "warmup"),
        help="untimed decode steps before them (default %(default)s)",
    )  # fmt: skip
    bench.add_argument(
        "--batch", type=integer(1), default=field_default(BenchSettings, "batch"),
        help="sequences decoded together, each with its own cache (default %(default)s)",
    )  # fmt: skip
    budget_arguments(bench)
    bench.add_argument("--threads", type=integer(1), help="torch threads (default: torch's)")
    bench.add_argument("--out", default="kvpop_bench", help="results folder (default %(default)s)")
    bench.set_defaults(run=bench_command)

    from ..engines import FORMATS, export

    exporter = commands.add_parser("export", help="transform a local Qwen3 and export an engine")
    model_argument(exporter)
    exporter.add_argument("--out", required=True, help="engine folder to write")
    exporter.add_argument(
        "--format", default=parameter_default(export, "format"), choices=list(FORMATS),
        help="engine format (default %(default)s)",
    )  # fmt: skip
    budget_arguments(exporter)
    exporter.add_argument("--scorer-path", metavar="DIR", help="folder written by save_scorer")
    exporter.add_argument(
        "--batch", type=integer(1), default=parameter_default(export, "batch"),
        help="sequences per call (default %(default)s)",
    )  # fmt: skip
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

    def setting(name: str, kind, help: str, **options) -> None:
        """A flag of the ``TrainSettings`` field ``name``, with its default."""
        trainer.add_argument(
            flag(name), type=kind, default=field_default(TrainSettings, name),
            help=f"{help} (default %(default)s)", **options,
        )  # fmt: skip

    setting("steps", integer(1), "optimizer steps")
    setting("seq_len", integer(2), "tokens per training sequence; more than the capacity")
    setting("batch_size", integer(1), "sequences per step")
    setting("lr", number(positive=True), "AdamW learning rate")
    setting("loss", None, choices_help(LOSS_HELP), choices=enum_values(LossKind))
    setting(
        "target", None,
        "what a token's future attention is reduced to over the later queries: "
        + choices_help(TARGET_HELP),
        choices=enum_values(TargetKind),
    )  # fmt: skip
    setting(
        "target_power", number(positive=True),
        "the power a of --target power_mean, (mean of p^a)^(1/a) over the later queries' "
        "attentions p: above 1 (1 is the mean, infinity the max); only with that target",
    )  # fmt: skip
    setting(
        "recall_fraction", number(positive=False),
        "share of the training sequences that are recall items planted in the data's own text "
        "(a key bound to a value, a question about it at the end), in [0, 1)",
    )  # fmt: skip
    setting("eval_every", integer(1), "steps between held-out evaluations")
    setting("checkpoint_every", integer(1), "steps between checkpoints")
    trainer.add_argument(
        "--init-from", metavar="DIR",
        help="start from a saved scorer folder instead of a random draw: the same kind, or an "
        "mlp scorer for --scorer memory (the memory scorer then starts as exactly that mlp)",
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
    server.add_argument("--scorer", action=Refused, use="--scorer-path", why=SCORER_IS_A_KIND)
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
