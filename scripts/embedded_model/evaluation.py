"""The held-out report: NLL and accuracy by position, and recall exact match."""

from __future__ import annotations

import torch
from transformers import Qwen3ForCausalLM

from kvpop_compile.embedded.corpus import encode, read_bytes
from kvpop_compile.embedded.recall import CONTEXT_LENGTHS, TASKS, recall_items
from kvpop_compile.evaluation.recall.protocol import answer_exactly, decode_stretch

EVAL_LEN = 2048
BUCKET = 512  # the held-out report splits positions into buckets of this many tokens
RECALL_EVAL_ITEMS = 64  # held-out recall items per task and length in the final report
RECALL_MONITOR_ITEMS = 16  # per task at 2048, measured at every checkpoint to follow progress
RECALL_DECODE_ITEMS = 16  # per task, asked the decode protocol's way in the final report
RECALL_DECODE_LENGTH = 1024  # the decode protocol's item length (the stretch fills the rest)


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


def held_out_recall(
    items_per_cell: int, lengths=CONTEXT_LENGTHS, families=("train", "held_out"), split="held_out"
) -> dict:
    """Recall items (text ``split``, seed 0) by (``families/task``, context length): trained
    and held-out families on held-out text, for the report; the monitor asks validation text."""
    return {
        (f"{group}/{task}", length): recall_items(split, task, length, items_per_cell, 0, 0, group)
        for group in families
        for task in TASKS
        for length in lengths
    }


@torch.no_grad()
def evaluate_recall(model: Qwen3ForCausalLM, cells: dict, batch: int = 8) -> dict:
    """Full-attention exact match per cell and length: ``{label: {str(length): accuracy}}``
    for the ``(label, length)`` keys of ``cells``.

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


@torch.no_grad()
def evaluate_decode_recall(model: Qwen3ForCausalLM, items_per_task: int) -> dict:
    """Full-attention exact match asked as the benchmark's decode protocol asks (the model's
    own greedy stretch between context and question, :mod:`kvpop_compile.evaluation.recall`):
    ``{"families/task": {"1024": accuracy}}`` over held-out text, trained and held-out
    families. Decoding, not teacher forcing: the stretch is whatever the model writes."""
    model.eval()
    stretch = decode_stretch(RECALL_DECODE_LENGTH, model.config.max_position_embeddings)
    report: dict = {}
    for group in ("train", "held_out"):
        for task in TASKS:
            items = recall_items(
                "held_out", task, RECALL_DECODE_LENGTH, items_per_task, 0, 0, group
            )
            exact = answer_exactly(model, items, "decode", stretch)
            report[f"{group}/{task}"] = {str(RECALL_DECODE_LENGTH): sum(exact) / len(exact)}
    return report


def recall_line(report: dict) -> str:
    return ", ".join(
        f"{task}@{length} {acc:.2f}"
        for task, by_len in report.items()
        for length, acc in by_len.items()
    )
