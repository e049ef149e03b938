"""``kvpop-compile eval --model --data``: a user's own checkpoint, tokenizer and text (a file, a
folder, prompt/answer records) through the quality benchmark, and the one-line refusals of bad
input."""

from __future__ import annotations

import json
import random

import pytest
import torch
from cli_support import cli_error
from tiny_models import tiny_qwen3

from kvpop_compile.cli import main
from kvpop_compile.evaluation.own_data import (
    UTF8_BYTES,
    answer_items,
    model_tokenizer,
    text_sequences,
)

SMALL = ["--length", "300", "--budgets", "75%", "--sequences", "2", "--no-plots", "--threads", "1"]


HEURISTICS = ["window", "random", "knorm", "h2o", "tova"]


BPE_VOCABULARY = 300


def _words(seed: int, count: int) -> str:
    """Deterministic prose-like text with names that recur far apart."""
    rng = random.Random(seed)
    names = ["alpha_value", "beta_count", "gamma_index", "delta_total", "the", "of", "and"]
    return " ".join(rng.choice(names) for _ in range(count))


def _tokenizer():
    """A byte-level BPE trained offline on a few strings, as transformers saves one."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCABULARY, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>"],
    )  # fmt: skip
    bpe.train_from_iterator([_words(s, 200) for s in range(4)], trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>")


@pytest.fixture(scope="module")
def byte_model(tmp_path_factory):
    """A byte-level checkpoint (vocabulary 256) without tokenizer files."""
    folder = tmp_path_factory.mktemp("byte-model")
    tiny_qwen3().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def bpe_model(tmp_path_factory):
    """A checkpoint with its own tokenizer (vocabulary 320, the tokenizer's 300 fit in it)."""
    folder = tmp_path_factory.mktemp("bpe-model")
    tiny_qwen3(vocab_size=320).save_pretrained(folder)
    _tokenizer().save_pretrained(folder)
    return folder


def _run(argv) -> None:
    assert main([str(a) for a in argv]) == 0


def test_text_file_is_read_with_the_checkpoints_own_tokenizer(bpe_model, tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text(_words(7, 600))
    out = tmp_path / "out"
    _run(["eval", "--model", bpe_model, "--data", text, "--out", out, *SMALL,
          "--protocols", "teacher_forced"])  # fmt: skip
    saved = json.loads((out / "quality.json").read_text())
    # No --scorer-root for a user's model: the heuristic policies only, and the report says so.
    assert list(saved["methods"]) == ["full"] + [f"{p} @ 75%" for p in HEURISTICS]
    assert "memory, mlp" in saved["run_notes"][0]
    assert saved["sequences"] == ["notes.txt@0", "notes.txt@300"]
    assert saved["length"] == 300 and saved["prompt_length"] == 225
    assert saved["tokenizer"] == f"the tokenizer in {bpe_model}"
    full = saved["methods"]["full"]
    assert full["teacher_forced"]["count"] == [300.0, 300.0]
    # Long-range targets are found in bytes: a tokenizer's ids have none.
    assert "lr_count" not in full["teacher_forced"]
    document = (out / "quality.md").read_text()
    assert "NLL (nats/token)" in document and "75% (75 tokens kept)" in document
    assert "## Notes" in document and "long-range figures" in document


def test_sequences_are_consecutive_windows_of_the_tokenized_text(bpe_model, tmp_path):
    tokenizer = model_tokenizer(bpe_model, 320)
    text = _words(3, 300)
    (tmp_path / "a.txt").write_text(text)
    data = text_sequences(tmp_path / "a.txt", tokenizer, length=40, count=3)
    ids = torch.tensor(_tokenizer()(text, add_special_tokens=False)["input_ids"])
    assert [s.source for s in data.sequences] == ["a.txt@0", "a.txt@40", "a.txt@80"]
    for index, sequence in enumerate(data.sequences):
        assert torch.equal(sequence.ids, ids[40 * index : 40 * index + 41])
        assert not sequence.byte_tokens


def test_folder_skips_binary_and_hidden_files_and_joins_the_rest(byte_model, tmp_path):
    data = tmp_path / "docs"
    (data / "sub").mkdir(parents=True)
    (data / ".git").mkdir()
    (data / "a.txt").write_text(_words(1, 15))  # shorter than a sequence: joined with the next
    (data / "sub" / "b.md").write_text(_words(2, 200))
    (data / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\0\0")
    (data / "latin1.txt").write_bytes("café".encode("latin-1"))
    (data / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    sequences = text_sequences(data, UTF8_BYTES, length=300, count=2)
    # The documents are joined by two newlines; the second window starts inside b.md.
    first = (data / "a.txt").read_bytes()
    joined = first + b"\n\n" + (data / "sub" / "b.md").read_bytes()
    sources = [s.source for s in sequences.sequences]
    assert sources == ["a.txt@0", f"sub/b.md@{300 - len(first) - 2}"]
    assert bytes(sequences.sequences[0].ids.tolist()) == joined[:301]
    assert sequences.notes == [f"2 files in {data} skipped: binary or not UTF-8"]

    out = tmp_path / "out"
    _run(["eval", "--model", byte_model, "--data", data, "--out", out, *SMALL,
          "--policies", "window"])  # fmt: skip
    saved = json.loads((out / "quality.json").read_text())
    assert list(saved["methods"]) == ["full", "window @ 75%"]
    assert saved["methods"]["full"]["continuation"]["agree"] == [75.0, 75.0]
    assert saved["tokenizer"] is None and "lr_count" in saved["methods"]["full"]["teacher_forced"]
    assert saved["data"].startswith(f"2 text files in `{data}`")
    document = (out / "quality.md").read_text()
    assert "read as UTF-8 bytes" in document and "skipped: binary or not UTF-8" in document


def _records(path, records) -> None:
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")


def test_prompt_answer_records_report_exact_match_per_method(bpe_model, tmp_path):
    records = tmp_path / "questions.jsonl"
    _records(records, [
        {"prompt": _words(s, 40 + 10 * (s % 2)), "answer": " beta_count"} for s in range(5)
    ])  # fmt: skip
    out = tmp_path / "out"
    _run(["eval", "--model", bpe_model, "--data", records, "--out", out, "--length", "300",
          "--budgets", "75%", "--batch", "2", "--threads", "1"])  # fmt: skip
    saved = json.loads((out / "answers.json").read_text())
    assert saved["items"] == [f"questions.jsonl:{n}" for n in range(1, 6)]
    assert saved["capacities"] == {"75%": 75}
    assert list(saved["methods"]) == ["full"] + [f"{p} @ 75%" for p in HEURISTICS]
    for record in saved["methods"].values():
        assert set(record["prefill"]["answers"]) <= {0.0, 1.0}
        assert len(record["prefill"]["answers"]) == 5
    document = (out / "answers.md").read_text()
    assert "| full attention | 0% |" in document and "| window (StreamingLLM) | 75% |" in document


def test_answer_is_the_tokens_that_follow_the_prompt(bpe_model, tmp_path):
    records = tmp_path / "q.jsonl"
    _records(records, [{"prompt": "the alpha_value of", "answer": " gamma_index"}])
    tokenizer = model_tokenizer(bpe_model, 320)
    (item,) = answer_items(records, tokenizer, max_positions=2048)
    whole = tokenizer.encode("the alpha_value of gamma_index")
    assert torch.equal(torch.cat([item.prompt, item.answer]), whole)
    assert item.source == "q.jsonl:1"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--data", "/nonexistent"], "argument --data: '/nonexistent' does not exist"),
        (["--data", "EMPTY"], "no text files in EMPTY: the folder is empty"),
        (["--data", "BINARY"], "no text files in BINARY: all 1 files are binary or not UTF-8"),
        (["--model", "BYTES", "--data", "SHORT"],
         "SHORT gives 20 tokens (UTF-8 bytes), fewer than one sequence needs: 301 for a length "
         "of 300"),
        (["--model", "BYTES", "--data", "MISSING_FIELD"],
         "MISSING_FIELD:3 has no 'answer' field; each line must be a JSON object"),
        (["--model", "BYTES", "--data", "NOT_JSON"], "NOT_JSON:1 is not JSON ("),
        (["--model", "BYTES", "--data", "NOT_STRING"],
         "NOT_STRING:1: 'answer' must be a non-empty string, got 42"),
        (["--model", "MISMATCH", "--data", "TEXT"],
         "tokens but the model's vocab_size is 256: the tokenizer and the weights do not belong"),
        (["--model", "NO_TOKENIZER", "--data", "TEXT"],
         "has no tokenizer files (tokenizer.json, tokenizer_config.json, tokenizer.model, "
         "vocab.json) and a vocab_size of 320"),
        (["--model", "BYTES", "--data", "TEXT", "--policies", "memory", "window"],
         "--policies memory: learned policies need scorers trained for this model; pass "
         "--scorer-root"),
        (["--model", "BYTES", "--data", "TEXT", "--length", "100"],
         "sequence length 100 keeps 25 tokens at the 75% budget, but window @ 75% needs more "
         "than sinks + window = 68; use a length of at least 276"),
        (["--model", "SHORT_CONTEXT", "--data", "TEXT"],
         "sequences of 300 tokens exceed the model's max_position_embeddings 256"),
        (["--data", "TEXT"],
         "no trained memory scorer for capacity 75 at "),
        (["--data", "TEXT", "--recall"], "--recall asks the built-in recall items"),
        (["--model", "BPE"], "the held-out sequences are UTF-8 bytes, so they need a byte-level "
         "model (vocab_size 256), got vocab_size 320; give --data"),
    ],
)  # fmt: skip
def test_bad_own_data_is_refused_in_one_line(
    argv, message, bpe_model, byte_model, tmp_path, capsys
):
    (tmp_path / "EMPTY").mkdir()
    (tmp_path / "BINARY").mkdir()
    (tmp_path / "BINARY" / "blob.bin").write_bytes(b"\0\1\2")
    (tmp_path / "SHORT").write_text("twenty bytes of text")
    _records(
        tmp_path / "MISSING_FIELD.jsonl",
        [{"prompt": "a", "answer": "b"}, {"prompt": "c", "answer": "d"}, {"prompt": "e"}],
    )
    (tmp_path / "NOT_JSON.jsonl").write_text("{prompt: 1}\n")
    _records(tmp_path / "NOT_STRING.jsonl", [{"prompt": "a", "answer": 42}])
    (tmp_path / "TEXT").write_text(_words(0, 200))
    mismatch = tmp_path / "MISMATCH"
    tiny_qwen3().save_pretrained(mismatch)
    _tokenizer().save_pretrained(mismatch)
    tiny_qwen3(vocab_size=320).save_pretrained(tmp_path / "NO_TOKENIZER")
    tiny_qwen3(max_position_embeddings=256).save_pretrained(tmp_path / "SHORT_CONTEXT")
    names = {
        "BYTES": byte_model, "BPE": bpe_model,
        **{p.name.removesuffix(".jsonl"): p for p in tmp_path.iterdir()},
    }  # fmt: skip
    argv = ["eval", *SMALL[:4], *(names.get(a, a) for a in argv), "--out", tmp_path / "out"]
    line = cli_error(argv, capsys)
    for name, path in names.items():
        message = message.replace(name, str(path))
    assert line.startswith("kvpop-compile eval: ") and message in line, line
