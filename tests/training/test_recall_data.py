"""Recall items planted in a user's own training text (``training/recall_data.py``), and the
``recall_fraction`` of a training run."""

import random

import pytest
import torch
from training_support import TEXTS, run

import kvpop_compile as kc
from kvpop_compile.embedded.recall import TASKS, assemble
from kvpop_compile.training.data import byte_tokenizer, pack
from kvpop_compile.training.recall_data import recall_sequences

TEXT = "\n".join(TEXTS).encode()


def pairs(text: str) -> list[int]:
    """A tokenizer of two bytes per token (a stand-in for a subword vocabulary)."""
    data = text.encode()
    return [data[i] * 256 + (data[i + 1] if i + 1 < len(data) else 0)
            for i in range(0, len(data), 2)]  # fmt: skip


def expected_item(seed: int, index: int, length: int):
    """The item the documented stream draws: tasks in turn, one seeded draw per sequence."""
    draw = f"user-data/{seed}/{index}"
    item = assemble(TEXT, TASKS[index % len(TASKS)], length, random.Random(f"{draw}/{length}"))
    return random.Random(f"{draw}/filler"), item


@pytest.mark.parametrize(
    ("seq_len", "tokenizer", "length"),
    [(2048, byte_tokenizer, 2048), (3000, byte_tokenizer, 2048), (700, byte_tokenizer, 512),
     (1100, pairs, 2048), (600, pairs, 1024)],
)  # fmt: skip
def test_each_sequence_ends_with_the_longest_item_that_fits_after_plain_text(
    seq_len, tokenizer, length
):
    filler = pack(TEXTS, tokenizer, seq_len)
    got = recall_sequences(TEXTS, filler, tokenizer, 5, seed=3)
    assert got.shape == (5, seq_len) and got.dtype == torch.int64
    for index, row in enumerate(got):
        rng, item = expected_item(3, index, length)
        ids = tokenizer((item.prompt + item.answer).decode("utf-8", errors="replace"))
        assert row[seq_len - len(ids) :].tolist() == ids  # the question and answer end it
        start = row[: seq_len - len(ids)]
        # The rest is the start of one plain sequence, drawn with the item's seed.
        assert torch.equal(start, filler[rng.randrange(filler.shape[0]), : start.numel()])
        assert item.task == TASKS[index % len(TASKS)]
    # Another seed draws other items.
    assert not torch.equal(recall_sequences(TEXTS, filler, tokenizer, 5, seed=4), got)


def test_text_or_sequences_too_short_for_an_item_are_refused():
    filler = pack(TEXTS, byte_tokenizer, 200)
    with pytest.raises(ValueError, match="seq_len 200 is shorter than the tokens of a 256-byte"):
        recall_sequences(TEXTS, filler, byte_tokenizer, 1)
    with pytest.raises(ValueError, match="need at least 1024 bytes of text .* has 11 bytes"):
        recall_sequences(["a\nb\nc\nd\ne\nf"], filler, byte_tokenizer, 1)
    with pytest.raises(ValueError, match="count must be >= 0, got -1"):
        recall_sequences(TEXTS, filler, byte_tokenizer, -1)
    assert recall_sequences(TEXTS, filler, byte_tokenizer, 0).shape == (0, 200)


@pytest.mark.parametrize("fraction", [-0.1, 1.0, True, "0.5"])
def test_recall_fraction_outside_zero_to_one_is_refused(fraction):
    with pytest.raises(ValueError, match="recall_fraction must be"):
        kc.TrainSettings(recall_fraction=fraction)


def test_a_run_with_recall_fraction_trains_on_plain_and_recall_sequences(tmp_path):
    plain = run(tmp_path / "plain", 2, seq_len=300)
    mixed = run(tmp_path / "mixed", 2, seq_len=300, recall_fraction=0.5)
    settings = [torch.load(tmp_path / name / "checkpoint.pt", weights_only=False)["settings"]
                for name in ("plain", "mixed")]  # fmt: skip
    # As many recall sequences as plain ones at 0.5; recorded, so a resume must match it.
    assert settings[1]["train_sequences"] == 2 * settings[0]["train_sequences"]
    assert settings[1]["recall_fraction"] == 0.5 and "recall_fraction" not in settings[0]
    assert mixed.history != plain.history  # the batches differ


def test_cli_train_mixes_recall_items_into_the_users_data(tmp_path, capsys):
    from tiny_models import tiny_qwen3

    from kvpop_compile.cli import main

    tiny_qwen3().save_pretrained(tmp_path / "checkpoint")
    (tmp_path / "data").mkdir()
    for i, text in enumerate(TEXTS):
        (tmp_path / "data" / f"{i}.py").write_text(text)
    args = ["train", "--model", str(tmp_path / "checkpoint"), "--data", str(tmp_path / "data"),
            "--out", str(tmp_path / "out"), "--sinks", "2", "--window", "8", "--topk", "16",
            "--steps", "2", "--seq-len", "300", "--batch-size", "2",
            "--tokenizer", "bytes"]  # fmt: skip
    assert main([*args, "--recall-fraction", "0.25"]) == 0
    settings = torch.load(tmp_path / "out" / "checkpoint.pt", weights_only=False)["settings"]
    assert settings["recall_fraction"] == 0.25
    assert main([*args, "--recall-fraction", "1", "--no-resume"]) == 2
    assert "recall_fraction must be in [0, 1), got 1.0" in capsys.readouterr().err


def _plain_greedy(model, ids: torch.Tensor, steps: int) -> torch.Tensor:
    """``steps`` greedy tokens after ``ids (P,)``, each from a whole forward without a cache: an
    oracle for the batched, cached continuation."""
    for _ in range(steps):
        logits = model(input_ids=ids[None], use_cache=False).logits[0, -1]
        ids = torch.cat([ids, logits.argmax()[None]])
    return ids


def test_stretched_sequences_put_the_models_own_continuation_before_the_question():
    """Items of several tasks and lengths (prompts, questions, answers and continuations of
    different lengths) asked in one batch: each row is the item's prompt up to its question
    line, the model's greedy continuation of that alone, then the question's rest and the
    answer, ``seq_len`` in all."""
    from tiny_models import tiny_qwen3

    from kvpop_compile.embedded.corpus import encode
    from kvpop_compile.training.recall_data import stretched_sequences

    model = tiny_qwen3(seed=3, dtype=torch.float64)  # float64: near-ties cannot flip an argmax
    shapes = [("lookup", 1024), ("multi_key", 512), ("chain", 512), ("lookup", 512)]
    items = [assemble(TEXT, task, length, random.Random(f"stretch/{n}"))
             for n, (task, length) in enumerate(shapes)]  # fmt: skip
    assert len({len(i.question) for i in items}) > 1 and len({len(i.answer) for i in items}) > 1
    seq_len = 1100
    rows = stretched_sequences(model, items, seq_len, batch=3)
    assert rows.shape == (4, seq_len) and rows.dtype == torch.int64
    for row, item in zip(rows, items, strict=True):
        cut = item.prompt.rindex(b"\n") + 1  # the question line's newline stays before the stretch
        stretch = seq_len - len(item.prompt) - len(item.answer)  # 76 or 588 here
        expected = torch.cat([
            _plain_greedy(model, encode(item.prompt[:cut]), stretch),
            encode(item.prompt[cut:] + item.answer),
        ])  # fmt: skip
        assert torch.equal(row, expected)
    # The continuations are the model's: another model writes other ones.
    other = stretched_sequences(tiny_qwen3(seed=4, dtype=torch.float64), items, seq_len)
    assert not torch.equal(other, rows)


def test_stretched_sequences_refuse_items_that_leave_no_room():
    from tiny_models import tiny_qwen3

    from kvpop_compile.training.recall_data import stretched_sequences

    item = assemble(TEXT, "lookup", 512, random.Random("room"))
    with pytest.raises(ValueError, match=r"512 bytes leaves no room .* seq_len 512"):
        stretched_sequences(tiny_qwen3(), [item], 512)
    with pytest.raises(ValueError, match="batch must be an integer >= 1, got 0"):
        stretched_sequences(tiny_qwen3(), [item], 600, batch=0)
