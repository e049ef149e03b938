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
import math
import platform
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from transformers import Qwen3Config, Qwen3ForCausalLM

# Runs from a clone without installing the package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvpop_compile.atomic import atomic_write, replace_folder  # noqa: E402
from kvpop_compile.embedded import EMBEDDED_MODEL  # noqa: E402
from kvpop_compile.embedded.corpus import (  # noqa: E402
    HELD_OUT_MODULUS,
    encode,
    read_bytes,
    split_files,
    stdlib_dir,
)
from kvpop_compile.embedded.recall import (  # noqa: E402
    CONTEXT_LENGTHS,
    TASKS,
    TRAINING_LENGTHS,
    RecallItem,
    make_item,
    recall_items,
)

SHORT_LEN, LONG_LEN = 512, 2048
EVAL_LEN = 2048
BUCKET = 512  # the held-out report splits positions into buckets of this many tokens
COPY_LEN = 256  # row length of the copy steps
COPY_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
RECALL_EVAL_ITEMS = 64  # held-out recall items per task and length in the final report
RECALL_MONITOR_ITEMS = 16  # per task at 2048, measured at every checkpoint to follow progress

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


@dataclass
class Progress:
    steps_copy: int = 0
    steps_short: int = 0
    steps_long: int = 0
    tokens: int = 0
    seconds: float = 0.0
    recall_items: int = 0

    def steps(self) -> int:
        return self.steps_copy + self.steps_short + self.steps_long


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


def learning_rate(progress: float, args: argparse.Namespace) -> float:
    """Linear warmup to ``args.lr``, then cosine decay to ``lr * min_lr_ratio``."""
    if progress < args.warmup:
        return args.lr * max(progress, 1e-3) / args.warmup
    t = min(1.0, (progress - args.warmup) / (1.0 - args.warmup))
    floor = args.lr * args.min_lr_ratio
    return floor + 0.5 * (args.lr - floor) * (1.0 + math.cos(math.pi * t))


def training_stream(files: list[str], seed: int) -> torch.Tensor:
    """All training files' bytes, concatenated in a seeded order: shape (total_bytes,), uint8."""
    order = torch.randperm(len(files), generator=torch.Generator().manual_seed(seed)).tolist()
    data = b"".join(read_bytes(files[i]) for i in order)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def copy_batch(batch: int, length: int, gen: torch.Generator) -> torch.Tensor:
    """Rows of one random string of 8-32 letters and digits repeated: (batch, length + 1) ids.

    Past its first period every byte is a copy of the byte one period back, and nothing but
    copying predicts it.
    """
    alphabet = torch.tensor(list(COPY_ALPHABET))
    rows = []
    for _ in range(batch):
        period = int(torch.randint(8, 33, (1,), generator=gen))
        piece = alphabet[torch.randint(0, len(alphabet), (period,), generator=gen)]
        rows.append(piece.repeat(length // period + 2)[: length + 1])
    return torch.stack(rows)


def sample_batch(stream: torch.Tensor, batch: int, length: int, gen: torch.Generator):
    """``batch`` random windows of ``length + 1`` bytes: (batch, length + 1) int64 ids."""
    starts = torch.randint(0, stream.numel() - length - 1, (batch,), generator=gen)
    offsets = torch.arange(length + 1)
    return stream[starts[:, None] + offsets].long()


class RecallMix:
    """Replaces a share of the 2048-byte training rows with recall items from training files.

    Items are drawn in order from the training split's streams (seed ``args.seed``), so a run
    never repeats an item; ``state``/``load_state`` carry the position across a resume.
    """

    def __init__(self, fraction: float, lengths: list[int], tasks: list[str], seed: int):
        self.fraction, self.lengths, self.tasks, self.seed = fraction, lengths, tasks, seed
        self.rng = random.Random(f"recall-mix/{seed}")
        self.next_index = 0

    def rows(self, ids: torch.Tensor, done: Progress) -> torch.Tensor:
        """Overwrite some rows of ``ids`` (batch, LONG_LEN + 1) in place.

        Returns two masks over the targets ``ids[:, 1:]``, each (batch, LONG_LEN): the bytes of
        the questions and answers, and the answers' bytes alone.
        """
        questions = torch.zeros(ids.shape[0], ids.shape[1] - 1, dtype=torch.bool)
        answers = torch.zeros_like(questions)
        for row in range(ids.shape[0]):
            if self.rng.random() >= self.fraction:
                continue
            length = self.rng.choice(self.lengths)
            data, start = b"", 0
            for _ in range(LONG_LEN // length):
                item = self._item(self.rng.choice(self.tasks), length)
                # Target j predicts byte j + 1, so the answer's bytes are targets from the
                # prompt's last byte on. A question starts on its own line, and is the only
                # part of the prompt after its last newline.
                first = start + len(item.prompt) - 1
                answers[row, first : first + len(item.answer)] = True
                asked = start + item.prompt.rindex(b"\n")
                questions[row, asked : first + len(item.answer)] = True
                data += item.prompt + item.answer
                start += length
                done.recall_items += 1
            # The row holds LONG_LEN + 1 bytes; a newline ends the last answer as code would.
            ids[row] = torch.frombuffer(bytearray(data + b"\n"), dtype=torch.uint8).long()
        return questions, answers

    def _item(self, task: str, length: int) -> RecallItem:
        self.next_index += 1
        return make_item("train", task, length, self.seed, self.next_index - 1)

    def state(self) -> dict:
        return {"rng": self.rng.getstate(), "next_index": self.next_index}

    def load_state(self, state: dict) -> None:
        self.rng.setstate(state["rng"])
        self.next_index = state["next_index"]


def held_out_sequences(files: list[str], limit: int) -> torch.Tensor:
    """The first ``EVAL_LEN + 1`` bytes of each held-out file that long: (S, EVAL_LEN + 1)."""
    rows = []
    for name in files:
        data = read_bytes(name)
        if len(data) > EVAL_LEN:
            rows.append(encode(data[: EVAL_LEN + 1]))
    if limit:
        rows = rows[:limit]
    if not rows:
        raise RuntimeError(f"no held-out file is longer than {EVAL_LEN} bytes")
    return torch.stack(rows)


@torch.no_grad()
def evaluate(model: Qwen3ForCausalLM, seqs: torch.Tensor, batch: int = 4) -> dict:
    """Mean NLL (nats/byte) and top-1 accuracy over all positions and per 512-position bucket.

    ``seqs`` is (S, EVAL_LEN + 1): position p is predicted from bytes 0..p.
    """
    model.eval()
    nll = torch.zeros(EVAL_LEN, dtype=torch.float64)
    correct = torch.zeros(EVAL_LEN, dtype=torch.float64)
    # The last bucket again, read without the file before it: the gap is what context gives.
    cut = EVAL_LEN - BUCKET
    alone_nll = alone_correct = 0.0
    for i in range(0, seqs.shape[0], batch):
        ids = seqs[i : i + batch]
        logits = model(input_ids=ids[:, :-1], use_cache=False).logits.float()  # (b, L, 256)
        targets = ids[:, 1:]
        logp = torch.log_softmax(logits, dim=-1)
        nll += -logp.gather(-1, targets[..., None])[..., 0].sum(0).double()
        correct += (logits.argmax(-1) == targets).sum(0).double()
        alone = model(input_ids=ids[:, cut:-1], use_cache=False).logits.float()  # (b, BUCKET, 256)
        alone_nll += -torch.log_softmax(alone, -1).gather(-1, targets[:, cut:, None]).sum().item()
        alone_correct += (alone.argmax(-1) == targets[:, cut:]).sum().item()
    n = seqs.shape[0]
    report = {
        "sequences": n,
        "length": EVAL_LEN,
        "nll": float(nll.sum() / (n * EVAL_LEN)),
        "accuracy": float(correct.sum() / (n * EVAL_LEN)),
        "buckets": [],
        "last_bucket_alone": {
            "nll": alone_nll / (n * BUCKET),
            "accuracy": alone_correct / (n * BUCKET),
        },
    }
    for start in range(0, EVAL_LEN, BUCKET):
        part = slice(start, start + BUCKET)
        report["buckets"].append(
            {
                "positions": [start, start + BUCKET],
                "nll": float(nll[part].sum() / (n * BUCKET)),
                "accuracy": float(correct[part].sum() / (n * BUCKET)),
            }
        )
    return report


def held_out_recall(items_per_cell: int, lengths=CONTEXT_LENGTHS) -> dict:
    """Held-out recall items (split ``held_out``, seed 0) by (task, context length)."""
    return {
        (task, length): recall_items("held_out", task, length, items_per_cell)
        for task in TASKS
        for length in lengths
    }


@torch.no_grad()
def evaluate_recall(model: Qwen3ForCausalLM, cells: dict, batch: int = 8) -> dict:
    """Full-attention exact match per task and length: ``{task: {str(length): accuracy}}``.

    Teacher forcing stands for greedy decoding here: greedy decoding produces the answer iff at
    every answer byte the argmax, given the prompt and the correct answer bytes before it, is
    that byte, which is what one batched forward over prompt + answer checks.
    """
    model.eval()
    report: dict = {}
    for (task, length), items in cells.items():
        hits = 0
        for i in range(0, len(items), batch):
            chunk = items[i : i + batch]
            ids = torch.stack([encode(it.prompt + it.answer) for it in chunk])  # (b, length)
            logits = model(input_ids=ids[:, :-1], use_cache=False).logits  # (b, length - 1, 256)
            guess = logits.argmax(-1)
            for row, it in enumerate(chunk):
                first = len(it.prompt) - 1  # the target after the prompt's last byte
                hits += bool((guess[row, first:] == ids[row, first + 1 :]).all())
        report.setdefault(task, {})[str(length)] = hits / len(items)
    return report


def recall_line(report: dict) -> str:
    return ", ".join(
        f"{task}@{length} {acc:.2f}"
        for task, by_len in report.items()
        for length, acc in by_len.items()
    )


def save_checkpoint(folder: Path, state: dict) -> None:
    """``state`` to ``folder/state.pt`` atomically: a cut-off write leaves the previous one."""
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write(folder / "state.pt", lambda tmp: torch.save(state, tmp))


def train(model, stream, args, log, resume: dict | None = None, checkpoint=None) -> Progress:
    """The training loop; returns how many steps and tokens it ran and for how long.

    ``resume`` is a state written by ``checkpoint(state)``, which is called every
    ``args.checkpoint_every`` minutes with everything needed to continue.
    """
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]  # norms
    optimizer = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": args.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=args.lr,
        betas=(0.9, 0.95),
    )
    gen = torch.Generator().manual_seed(args.seed + 1)
    mix = RecallMix(args.recall_fraction, args.recall_lengths, args.recall_tasks, args.seed)
    budget = args.minutes * 60.0
    done = Progress()
    spent = 0.0  # seconds of training before this process (a resumed run)
    if resume is not None:
        optimizer.load_state_dict(resume["optimizer"])
        gen.set_state(resume["generator"])
        mix.load_state(resume["recall_mix"])
        done = Progress(**resume["progress"])
        spent = done.seconds
        log(f"resumed at step {done.steps()}, {spent / 60:.1f} min in")
    start = time.perf_counter()
    last_checkpoint = start
    model.train()
    while True:
        elapsed = spent + time.perf_counter() - start
        step = done.steps()
        if (
            args.checkpoint_every
            and time.perf_counter() - last_checkpoint >= 60 * args.checkpoint_every
        ):
            done.seconds = elapsed
            checkpoint(
                {
                    "optimizer": optimizer.state_dict(),
                    "generator": gen.get_state(),
                    "recall_mix": mix.state(),
                    "progress": vars(done).copy(),
                }
            )
            model.train()
            last_checkpoint = time.perf_counter()
        progress = step / args.steps if args.steps is not None else elapsed / budget
        if progress >= 1.0:
            break
        copying = step < args.copy_steps
        length = LONG_LEN if progress >= 1.0 - args.long_fraction else SHORT_LEN
        lr = learning_rate(progress, args)
        for group in optimizer.param_groups:
            group["lr"] = lr
        if copying:
            length = COPY_LEN
            ids = copy_batch(args.batch_tokens // length, length, gen)
        else:
            ids = sample_batch(stream, args.batch_tokens // length, length, gen)
        use_mix = length == LONG_LEN and args.recall_fraction and not copying
        recall = mix.rows(ids, done) if use_mix else None
        logits = model(input_ids=ids[:, :-1], use_cache=False).logits  # (batch, length, 256)
        per_byte = torch.nn.functional.cross_entropy(
            logits.reshape(-1, 256), ids[:, 1:].reshape(-1), reduction="none"
        )
        loss = per_byte.mean()
        answer_loss = None
        if recall is not None and recall[0].any():
            questions, answers = (mask.reshape(-1) for mask in recall)
            loss = loss + args.recall_weight * per_byte[questions].mean()
            answer_loss = per_byte[answers].detach().mean()  # logged: the part that is recall
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if copying:
            done.steps_copy += 1
        elif length == LONG_LEN:
            done.steps_long += 1
        else:
            done.steps_short += 1
        done.tokens += ids.shape[0] * length
        if (step + 1) % args.log_every == 0:
            answer = f" answer {answer_loss.item():.3f}" if answer_loss is not None else ""
            log(
                f"step {step + 1} {'copy' if copying else 'len'} {length} "
                f"loss {loss.item():.4f}{answer} lr {lr:.2e} "
                f"tokens {done.tokens:,} {elapsed / 60:.1f} min"
            )
    done.seconds = spent + time.perf_counter() - start
    model.eval()
    return done


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
    recall = recall_section(report["recall"], runs)
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


def recall_section(recall: dict, runs: list[dict]) -> str:
    """The card's account of the recall items trained on and the held-out exact match."""
    trained = [r for r in runs if r.get("recall_items")]
    lengths = [str(n) for n in CONTEXT_LENGTHS]
    table = "\n".join(
        f"| `{task}` | " + " | ".join(f"{recall[task][n]:.3f}" for n in lengths) + " |"
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

`kvpop_compile.embedded.recall` plants lines in real standard-library code and asks for them at
the end: `lookup` (`QZWKRT = 4821` early, the prompt ends `assert QZWKRT == `), `multi_key`
(eight such definitions, one asked for), `chain` (`a = 4821` … `b = a` … `print(b)  # `, next
to a second chain with another value), `call` (`def f():` / `return 4821` early, the prompt
ends `assert f() == `). Names are six random letters and values four random digits, drawn from
the item's seed and found nowhere else in the item; the line that holds the answer ends at least
half the context before the question.

{how}

Exact match of the greedy answer with full attention, {RECALL_EVAL_ITEMS} held-out items per task
and context length (bytes):

| task | {" | ".join(lengths)} |
|---|{"---|" * len(lengths)}
{table}
"""


def save(model, out: Path, card: str, split: dict, runs: list[dict]) -> None:
    """Write the folder beside ``out`` and move it into place (replacing an old one)."""

    def write(folder: Path) -> None:
        model.save_pretrained(folder, safe_serialization=True)
        (folder / "split.json").write_text(json.dumps(split, indent=1) + "\n")
        (folder / "MODEL_CARD.md").write_text(card)
        (folder / "recipe.json").write_text(json.dumps(runs, indent=1) + "\n")

    replace_folder(out, write)


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

    monitor = held_out_recall(RECALL_MONITOR_ITEMS, lengths=(LONG_LEN,))

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
