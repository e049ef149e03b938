"""What each ``kvpop-compile`` subcommand does with its parsed arguments: load the model, run
the library, print and write the results. Each returns the exit status."""

from __future__ import annotations

import argparse
from pathlib import Path

from .arguments import config_from_arguments
from .limits import (
    check_bench_memory,
    check_demo_items,
    check_export_memory,
    check_prefill_length,
)


def demo_command(args: argparse.Namespace) -> int:
    from ..evaluation.demo import run_demo

    check_demo_items(args.items, args.context)  # before the model loads
    result = run_demo(
        items=args.items, context=args.context, model_path=args.model, scorer=args.scorer_path,
        policy=args.policy, capacity=args.capacity, image=None if args.no_image else args.image,
    )  # fmt: skip
    for line in result.report():
        print(line)
    return 0


def eval_command(args: argparse.Namespace) -> int:
    import json

    from ..evaluation import write_report

    out = Path(args.out)
    if args.resume and (args.report_only or not args.recall):
        raise ValueError(
            "--resume goes on with a recall run (--recall without --report-only); "
            + ("--report-only runs no method" if args.report_only else "add --recall")
        )
    if args.report_only:
        report = "recall" if args.recall else "quality"
        saved = out / f"{report}.json"
        if not saved.is_file():
            run = "kvpop-compile eval --recall" if args.recall else "kvpop-compile eval"
            raise FileNotFoundError(f"{saved} not found: run {run} without --report-only first")
        if args.recall:  # recall.md from recall.json, joined with kvpress_recall.json if there
            from ..evaluation.recall import write_recall_report

            result = write_recall_report(json.loads(saved.read_text()), out)
        else:
            result = write_report(json.loads(saved.read_text()), out, plots=not args.no_plots)
        print(result["document"])
        print(f"wrote {out / f'{report}.md'} and {saved}")
        return 0
    if args.recall and args.data is not None:
        raise ValueError(
            f"--recall asks the built-in recall items, --data {args.data} gives your own: drop "
            "--recall, and give your questions as a .jsonl of prompt/answer records"
        )
    from ..evaluation.methods import methods, runnable_policies

    # Trained scorers are at hand for the embedded model (shipped) or with --scorer-root.
    policies, notes = runnable_policies(
        None if args.policies is None else tuple(args.policies),
        scorers=args.model is None or args.scorer_root is not None,
    )
    if not args.recall:  # the recall items have lengths of their own
        # before the model loads
        methods(policies, args.budgets, args.length, args.priority_span, args.scorer_root)
    if args.model is None:
        from ..embedded import load_embedded_model

        model, name = load_embedded_model(), "the embedded model"
    else:
        from ..evaluation.own_data import load_checkpoint

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
    from ..evaluation import held_out_sequences

    data = held_out_sequences(args.sequences, length=args.length)
    return _eval_sequences(
        args, model, name, out, data, policies, {"run_notes": notes} if notes else {}
    )


def _eval_sequences(
    args: argparse.Namespace, model, name: str, out: Path, data: list, policies, about: dict
) -> int:
    """The quality benchmark on the sequences ``data``; ``about`` joins the report."""
    from ..evaluation import EvalSettings, evaluate_sequences
    from ..evaluation.data import default_prompt_length

    length = data[0].ids.numel() - 1
    prompt_length = args.prompt_length or default_prompt_length(length)
    settings = EvalSettings(
        batch=args.batch, protocols=tuple(args.protocols), prompt_length=prompt_length,
        threads=args.threads,
    )  # fmt: skip
    result = evaluate_sequences(
        model, out, data, policies=policies, budgets=args.budgets, settings=settings,
        scorer_root=args.scorer_root, model_name=name, about=about,
        plots=not args.no_plots, priority_span=args.priority_span,
    )  # fmt: skip
    print(result["document"])
    print(f"wrote {out / 'quality.md'} and {out / 'quality.json'}")
    return 0


def _eval_own_data(
    args: argparse.Namespace, model, name: str, out: Path, policies, notes: list[str]
) -> int:
    """``--data``: text through the quality benchmark, a .jsonl through exact-match answers."""
    from ..evaluation.methods import methods
    from ..evaluation.own_data import UTF8_BYTES, is_answers, model_tokenizer, text_sequences

    vocab_size = model.config.vocab_size
    if args.model is not None:
        tokenizer = model_tokenizer(args.model, vocab_size)
    else:
        tokenizer = UTF8_BYTES  # the embedded model is byte-level and has no tokenizer files
    if is_answers(args.data):
        from ..evaluation.own_data import answer_items
        from ..evaluation.quality import evaluate_answers

        items = answer_items(args.data, tokenizer, model.config.max_position_embeddings)
        result = evaluate_answers(
            model, out, items, methods=methods(policies, args.budgets, args.length,
                                               args.priority_span, args.scorer_root),
            batch=args.batch, scorer_root=args.scorer_root, model_name=name,
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
    from ..evaluation.methods import methods
    from ..evaluation.recall import RecallSettings, evaluate_recall

    settings = RecallSettings(
        items=args.recall_items, batch=args.batch, lengths=args.recall_lengths,
        protocols=args.recall_protocols, families=args.recall_families,
    )  # fmt: skip
    result = evaluate_recall(
        model, out,
        methods=methods(policies, args.budgets, priority_span=args.priority_span,
                        scorer_root=args.scorer_root),
        settings=settings,
        scorer_root=args.scorer_root, model_name=name, resume=args.resume,
    )  # fmt: skip
    print(result["document"])
    for note in notes:
        print(note)
    print(f"wrote {out / 'recall.md'} and {out / 'recall.json'}")
    return 0


def bench_command(args: argparse.Namespace) -> int:
    import torch

    from ..evaluation.bench import (
        BenchSettings,
        bench_model,
        bench_setup,
        bench_table,
        run_bench,
        write_bench,
    )

    if args.layers is not None and args.model is not None:
        raise ValueError(
            f"--layers {args.layers} cuts a --shape model; a --model checkpoint runs all its layers"
        )
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.threads:
        torch.set_num_threads(args.threads)
    config = config_from_arguments(args)
    settings = BenchSettings(
        contexts=tuple(n for group in args.contexts for n in group),
        methods=tuple(m for group in args.methods for m in group),
        decode_tokens=args.decode_tokens, warmup=args.warmup, kvpop_config=config, batch=args.batch,
    )  # fmt: skip
    check_bench_memory(args, settings, device)  # before the model is built or loaded
    model, name = bench_model(
        path=args.model, shape=args.shape, layers=args.layers, dtype=args.dtype, device=device,
        settings=settings,
    )  # fmt: skip
    result = run_bench(model, settings, model_name=name)
    files = write_bench(result, args.out)
    print(bench_setup(result), bench_table(result), sep="\n\n")
    print(f"wrote {', '.join(str(f) for f in files)}")
    return 0


def _budget_and_model(args: argparse.Namespace):
    """The ``KVpopConfig`` of the budget arguments, and the untransformed ``--model``."""
    from transformers import AutoModelForCausalLM

    config = config_from_arguments(args)
    return config, AutoModelForCausalLM.from_pretrained(args.model, attn_implementation="sdpa")


def export_command(args: argparse.Namespace) -> int:
    from ..engines import export
    from ..scorer_io import load_scorer
    from ..transform import transform

    check_prefill_length(args.prefill_length, args.model)  # before the weights load
    config, model = _budget_and_model(args)
    model = transform(model.eval(), config)
    check_export_memory(model, args.batch, args.prefill_length)
    if args.scorer_path:
        load_scorer(model, args.scorer_path)
    folder = export(
        model, args.out, args.format, batch=args.batch, prefill_length=args.prefill_length
    )
    print(f"wrote {args.format} engine to {folder}")
    return 0


def train_command(args: argparse.Namespace) -> int:
    from ..training import TrainSettings, train_scorer
    from ..training.trainer import CheckpointError

    # Settings, then the tokenizer, before the model loads: each refuses what it cannot use.
    settings = TrainSettings(
        steps=args.steps, seq_len=args.seq_len, batch_size=args.batch_size, lr=args.lr,
        loss=args.loss, target=args.target, target_power=args.target_power,
        eval_every=args.eval_every,
        checkpoint_every=args.checkpoint_every, init_from=args.init_from,
        resume=not args.no_resume, recall_fraction=args.recall_fraction,
    )  # fmt: skip
    tokenizer = _train_tokenizer(args)
    config, model = _budget_and_model(args)
    try:
        report = train_scorer(
            model, args.data, config, settings, output_dir=args.out, tokenizer=tokenizer
        )
    except CheckpointError as error:  # its message names the library's resume=False
        raise ValueError(
            f"{error.path} {error.problem}: pass --no-resume to start over (it is overwritten), "
            "or give another --out"
        ) from None
    for evaluation in report.evaluations:
        print(
            f"step {evaluation['step']}: held-out loss {evaluation['loss']:.4f}, "
            f"ranking accuracy {evaluation['accuracy']:.3f}"
        )
    print(f"wrote scorer to {report.scorer_path}")
    return 0


def _train_tokenizer(args: argparse.Namespace):
    """``train --tokenizer``: the checkpoint's own tokenizer (text -> ids), or None for UTF-8
    bytes. A checkpoint without tokenizer files is refused: transformers would give a tokenizer
    with an empty vocabulary, which turns any text into no tokens."""
    from ..evaluation.own_data import TOKENIZER_FILES

    if args.tokenizer == "bytes":
        return None
    if not any((Path(args.model) / name).is_file() for name in TOKENIZER_FILES):
        raise ValueError(
            f"--model {args.model}: no tokenizer found (none of {', '.join(TOKENIZER_FILES)}); "
            "pass --tokenizer bytes to train on UTF-8 bytes (a byte-level model, vocab_size "
            "256), or save the model's tokenizer into the folder (tokenizer.save_pretrained)"
        )
    from transformers import AutoTokenizer

    encode = AutoTokenizer.from_pretrained(args.model)
    return lambda text: encode(text)["input_ids"]
