"""The run records (``recipe.json``), the model card and the written model folder."""

from __future__ import annotations

import json
import platform
from pathlib import Path

import torch
import transformers

from kvpop_compile.atomic import replace_folder
from kvpop_compile.embedded.corpus import HELD_OUT_MODULUS
from kvpop_compile.embedded.recall import CONTEXT_LENGTHS, TASKS
from kvpop_compile.embedded.recall_syntax import ALPHABETS, FAMILIES

from .data_mix import COPY_LEN, LONG_LEN, LOOP_UNIT, SHORT_LEN, STRETCH_ITEM_LEN
from .evaluation import BUCKET, EVAL_LEN, RECALL_DECODE_ITEMS, RECALL_EVAL_ITEMS
from .progress import Progress


def command_line(argv: list[str]) -> str:
    return " ".join(["python scripts/train_embedded_model.py", *argv])


def run_argv(argv: list[str]) -> list[str]:
    """The arguments that define a run: ``--resume`` only says how it was continued."""
    return [a for a in argv if a != "--resume"]


def recipe_table(runs: list[dict]) -> str:
    """The runs that made the checkpoint, in order, as a markdown table."""
    rows = [
        "| run | command | seed | peak lr | copy steps / steps at 512 / 2048 | tokens "
        "| recall items | minutes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(runs, 1):
        rows.append(
            f"| {i} | `{r['command']}` | {r['seed']} | {r['lr']:g} | "
            f"{r.get('steps_copy', 0)} / {r['steps_short']} / {r['steps_long']} | "
            f"{r['tokens']:,} | "
            f"{r.get('recall_items', 0):,} | {r['minutes']:.1f} |"
        )
    return "\n".join(rows)


def this_run(args, argv, done: Progress) -> dict:
    return {
        "command": command_line(run_argv(argv)),
        "seed": args.seed,
        "lr": args.lr,
        "long_fraction": args.long_fraction,
        "recall_fraction": args.recall_fraction,
        "recall_lengths": args.recall_lengths,
        "recall_tasks": args.recall_tasks,
        "recall_weight": args.recall_weight,
        "recall_items": done.recall_items,
        "recall_stretch_fraction": args.recall_stretch_fraction,
        "stretch_items": done.stretch_items,
        "steps_copy": done.steps_copy,
        "steps_short": done.steps_short,
        "steps_long": done.steps_long,
        "tokens": done.tokens,
        "minutes": round(done.seconds / 60, 2),
    }


def model_card(args, config, n_params, files, runs, report, stats) -> str:
    train_files, held_files = files
    recipe = recipe_table(runs)
    total_tokens = sum(r["tokens"] for r in runs)
    total_minutes = sum(r["minutes"] for r in runs)
    rows = "\n".join(
        f"| {b['positions'][0]}-{b['positions'][1]} | {b['nll']:.3f} | {b['accuracy']:.3f} |"
        for b in report["buckets"]
    )
    early, late = report["buckets"][0], report["buckets"][-1]
    alone = report["last_bucket_alone"]
    recall = recall_section(report["recall"], runs, report.get("recall_decode"))
    return f"""# qwen3-stdlib

A byte-level `Qwen3ForCausalLM` ({n_params:,} parameters) trained from scratch on the Python
{platform.python_version()} standard library's `.py` files, so that `kvpop_compile` has a model
whose attention means something, offline, on any machine. Tokens are UTF-8 bytes (ids 0..255;
no tokenizer files). Load it with `kvpop_compile.embedded.load_embedded_model()` or
`AutoModelForCausalLM.from_pretrained(folder)`.

## Model

hidden {config.hidden_size}, {config.num_hidden_layers} layers, \
{config.num_attention_heads} query heads / {config.num_key_value_heads} KV heads, head_dim \
{config.head_dim}, MLP {config.intermediate_size}, tied embeddings, RoPE theta \
{config.rope_parameters["rope_theta"]:g}, context {config.max_position_embeddings}. Weights are \
float32 in `model.safetensors`.

The attention is full size (4 query heads of 64, GQA 2:1, as in Qwen3 but smaller) because the
project studies which cached tokens attention uses; the MLP is kept at 2x hidden because two
shared CPU cores bound the compute, and a smaller model sees more of the corpus in the same
time. Theta 1e4 rather than Qwen3's 1e6 spreads the rotary frequencies over 2048 positions.

## Data and split

`.py` files under the standard library folder (`sysconfig.get_paths()["stdlib"]`), read as raw
bytes. Excluded: `site-packages`/`dist-packages` (third-party code); test folders (`test`,
`tests`, `idle_test`), because Debian and Ubuntu ship them in a separate package, so they are
absent on many machines, and they hold deliberately odd code; generated files: `pydoc_data`
(a 750 KB string of documentation), `_sysconfigdata_*` and `config-*` (machine-specific) and the
character-map tables in `encodings` (near-identical 256-entry hex tables).

A file is held out iff `int(sha256(relative POSIX path).hexdigest(), 16) % {HELD_OUT_MODULUS} == 0`,
so the rule reproduces the split anywhere without a list; `split.json` lists the files used
here: {len(train_files)} training files ({stats["train_bytes"]:,} bytes) and {len(held_files)}
held-out files ({stats["held_bytes"]:,} bytes). Held-out files were never trained on.

## Recipe

{recipe}

Each run: float32 on CPU, AdamW (betas 0.9/0.95, weight decay {args.weight_decay} on matrices,
none on norms), linear warmup over {args.warmup:.0%} of the run to the peak learning rate,
cosine decay to {args.min_lr_ratio:g}x of it, gradient clipping at 1.0, {args.batch_tokens}
tokens per step. Training windows start at random offsets in the training files concatenated in
an order seeded by the run's seed; a run trains on {SHORT_LEN}-byte windows first and on
{LONG_LEN}-byte windows for its last share (`long_fraction`), so that the model works at its
full context. Last run on torch {torch.__version__}, transformers {transformers.__version__}.
In all: {total_tokens:,} training tokens ({total_tokens / stats["train_bytes"]:.2f} epochs) in
{total_minutes:.1f} minutes of training.

## Held-out evaluation

The first {EVAL_LEN} + 1 bytes of each of the {report["sequences"]} held-out files longer than
{EVAL_LEN} bytes, teacher-forced: mean NLL **{report["nll"]:.3f} nats/byte** (uniform: 5.545),
top-1 accuracy **{report["accuracy"]:.3f}**.

| positions | NLL (nats/byte) | top-1 accuracy |
|---|---|---|
{rows}

Accuracy at positions {late["positions"][0]}-{late["positions"][1]} is {late["accuracy"]:.3f}
against {early["accuracy"]:.3f} at {early["positions"][0]}-{early["positions"][1]}. That
comparison mixes two effects: later bytes have more context, but the start of a file is also a
different kind of text (licence header, module docstring, imports). To isolate the use of
context, the same last {BUCKET} bytes of each sequence were also scored *alone*, with no earlier
text: accuracy {alone["accuracy"]:.3f} and NLL {alone["nll"]:.3f} without the first
{late["positions"][0]} bytes, against {late["accuracy"]:.3f} and {late["nll"]:.3f} with them. The
difference is what the model takes from text more than {BUCKET} bytes back (identifiers, names
and idioms seen earlier in the file): the part a bounded cache can lose.

{recall}"""


REPORTED_GROUPS = ("train", "held_out")
GROUP_NAMES = {"train": "trained families", "held_out": "held-out families"}

VALUE_ONLY_CHAIN_RUNS = (3, 4)
"""Runs (1-based) trained while ``chain`` items were answered by the value alone."""


def recall_section(recall: dict, runs: list[dict], decode: dict | None = None) -> str:
    """The card's account of the recall items trained on and the held-out exact match, trained
    and held-out families apart (``decode``: asked the decode protocol's way, where the report
    has it)."""
    trained = [r for r in runs if r.get("recall_items")]
    lengths = [str(n) for n in CONTEXT_LENGTHS]
    table = "\n".join(
        f"| {GROUP_NAMES[group]} | `{task}` | "
        + " | ".join(f"{recall[f'{group}/{task}'][n]:.3f}" for n in lengths)
        + " |"
        for group in REPORTED_GROUPS
        for task in TASKS
    )
    if trained:
        mix = ", ".join(
            f"run {runs.index(r) + 1}: {r['recall_fraction']:.0%} of the 2048-byte rows, "
            f"{r['recall_items']:,} items, recall weight {r['recall_weight']:g}, item lengths "
            f"drawn from {r['recall_lengths']}, tasks from {r.get('recall_tasks', list(TASKS))}"
            for r in trained
        )
        how = f"""Recall items were mixed into training ({mix}). A recall row is 2048 bytes of
items of one length (eight items to one), each item's task drawn from the run's list; the loss
on such a row is the ordinary next-byte loss over all its bytes (the planted lines and the
question included) plus the recall weight times the mean loss over the bytes of the questions
and their answers, so that copying the asked name and then its value from far back carries
weight.
Training items come from the training files with the run's seed; the items below come from the
held-out files, and the split's name is part of every item's seed, so no training item can
equal a held-out one."""
        early = [n for n in VALUE_ONLY_CHAIN_RUNS if n <= len(runs)]
        if early:
            how += f"""

Runs {" and ".join(map(str, early))} asked chain items for the value alone (`print(b)  # ` →
`4821`). The model answered about half of them at 2048 bytes: the decoy chain's value as often
as the asked one, which a 4-layer model reading both hops in one forward pass did not get past.
Later runs and the benchmark ask for the hop written out (`assert b == ` → `a == 4821`), so
that each step of the answer is a lookup of one name."""
        stretched = [r for r in runs if r.get("stretch_items")]
        if stretched:
            share = ", ".join(
                f"run {runs.index(r) + 1}: {r['stretch_items']:,} items "
                f"({r['recall_stretch_fraction']:.0%} of its recall rows)"
                for r in stretched
            )
            how += f"""

Some recall rows were asked the way the benchmark's decode protocol asks ({share}): one
{STRETCH_ITEM_LEN}-byte item whose question comes after {LONG_LEN - STRETCH_ITEM_LEN} bytes
standing for the model's own greedy text: training code of random length, then a unit of
{LOOP_UNIT[0]}-{LOOP_UNIT[1]} bytes cut from just before it, repeated to the end of the stretch.
Greedy decoding of this model settles into such a loop (`a string a string …`), and a model
never asked a question after one answered `chain` with the first hop alone. The stretch's bytes
are left out of the next-byte loss."""
        copied = [r for r in runs if r.get("steps_copy")]
        if copied:
            steps = ", ".join(f"run {runs.index(r) + 1}: {r['steps_copy']}" for r in copied)
            how += f"""

Before the recall mix, the run began with steps on copy rows ({steps} steps of
{COPY_LEN}-byte rows): a random string of 8-32 letters and digits repeated, which nothing but
copying predicts. The text-trained model could not copy at all (a block of code repeated cost
as much the second time as the first), and neither recall nor copying moved for hundreds of steps
without this; on copy rows alone copying appears after about 250 steps."""
    else:
        how = "No recall items were trained on; the figures below measure the model as it is."
    return f"""## Long-range recall

`kvpop_compile.embedded.recall` plants bindings in real standard-library code and asks for them
at the end: `lookup` (one binding early, the prompt ends with its family's question), `multi_key`
(up to eight bindings of one family, one asked for), `chain` (`a` bound to a value, later `b`
bound to `a`, next to a second chain; the answer writes the hop, the question for `a` and its
value). Keys are six random letters found nowhere else in the item; the bindings the answer
follows from end at least half the context before the question.

Each item is written in one syntax family and one value alphabet
(`kvpop_compile.embedded.recall_syntax`), split whole:

{family_table()}

A held-out group draws its values from its own alphabet and the training ones at even odds.

{how}

Exact match of the greedy answer with full attention on held-out files, {RECALL_EVAL_ITEMS} items
per family group, task and context length (bytes):

| families | task | {" | ".join(lengths)} |
|---|---|{"---|" * len(lengths)}
{table}
{decode_section(decode)}"""


def family_table() -> str:
    """The family split as a markdown table: each split's syntaxes (binding → question, with
    the key ``key`` and the value ``value``) and alphabets."""
    rows = ["| split | families (binding → question) | value alphabets |", "|---|---|---|"]
    for split, families in FAMILIES.items():
        shown = "; ".join(
            f"{f.name}: `{f.binding('key', 'value').rstrip()}` → `{f.ask.format(key='key')}`"
            for f in families
        )
        shown = shown.replace("\n", "\\n").replace("|", "\\|")
        alphabets = ", ".join(a.name for a in ALPHABETS[split])
        rows.append(f"| {split} | {shown} | {alphabets} |")
    return "\n".join(rows)


def decode_section(decode: dict | None) -> str:
    """The card's decode-protocol table, or nothing for a report without one."""
    if decode is None:
        return ""
    length = next(iter(next(iter(decode.values()))))
    rows = "\n".join(
        f"| {GROUP_NAMES[group]} | `{task}` | {decode[f'{group}/{task}'][length]:.3f} |"
        for group in REPORTED_GROUPS
        for task in TASKS
    )
    return f"""
Asked as the benchmark's decode protocol asks: the context up to the question, then as many
tokens as the context has generated greedily by the model itself, then the question;
{RECALL_DECODE_ITEMS} held-out items per family group and task at {length} bytes, full attention:

| families | task | {length} |
|---|---|---|
{rows}
"""


def save(model, out: Path, card: str, split: dict, runs: list[dict]) -> None:
    """Write the folder beside ``out`` and move it into place (replacing an old one)."""

    def write(folder: Path) -> None:
        model.save_pretrained(folder, safe_serialization=True)
        (folder / "split.json").write_text(json.dumps(split, indent=1) + "\n")
        (folder / "MODEL_CARD.md").write_text(card)
        (folder / "recipe.json").write_text(json.dumps(runs, indent=1) + "\n")

    replace_folder(out, write)
