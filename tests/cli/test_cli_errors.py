"""Values too large for the machine or the model, malformed data and a checkpoint of another run:
each command refuses them up front in one line (exit status 2) that names the value given and
what is allowed, instead of a traceback or a run that would not end."""

from __future__ import annotations

import functools
import json
import types

import pytest
import torch
from cli_support import cli_error
from tiny_models import tiny_qwen3
from training_support import TEXTS

import kvpop_compile as kc
import kvpop_compile.engines
import kvpop_compile.evaluation.demo
import kvpop_compile.evaluation.recall
from kvpop_compile.cli import limits, main
from kvpop_compile.embedded.recall import TASKS, split_text
from kvpop_compile.evaluation.own_data import UTF8_BYTES, text_sequences

# One layer of the tiny shape keeps 2 KV heads x 16 dims of keys and values: 256 float32 bytes
# a token. One warm-up and two timed steps: a dynamic cache holds the context + 3 tokens.
BENCH = ["bench", "--shape", "tiny", "--layers", "1", "--device", "cpu", "--methods", "dynamic",
         "--decode-tokens", "2", "--warmup", "1", "--sinks", "2", "--window", "8", "--topk",
         "22"]  # fmt: skip
TOKEN_BYTES = 256
BUDGET = ["--sinks", "2", "--window", "4", "--topk", "10"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A byte-level checkpoint (vocabulary 256, 300 positions) without tokenizer files."""
    folder = tmp_path_factory.mktemp("checkpoint")
    tiny_qwen3(max_position_embeddings=300).save_pretrained(folder)
    return folder


def memory(monkeypatch, available: int) -> None:
    """Make the command line see ``available`` bytes of free memory."""
    monkeypatch.setattr(limits, "available_memory", lambda device: available)


def test_bench_context_beyond_memory_is_refused_naming_the_longest_that_fits(monkeypatch, capsys):
    line = cli_error([*BENCH, "--contexts", "32,100000000k"], capsys)
    assert line.startswith("kvpop-compile bench: --contexts 100000000k: a prompt of "
                           "102,400,000,000 tokens needs at least ")  # fmt: skip
    # With 10**6 bytes: n int64 ids and n + 3 cached tokens need 8n + 256(n + 3) bytes.
    memory(monkeypatch, 10**6)
    longest = (10**6 - TOKEN_BYTES * 3) // (8 + TOKEN_BYTES)
    assert 8 * longest + TOKEN_BYTES * (longest + 3) <= 10**6
    assert 8 * (longest + 1) + TOKEN_BYTES * (longest + 4) > 10**6
    line = cli_error([*BENCH, "--contexts", str(longest + 1)], capsys)
    assert f"--contexts {longest + 1}: " in line
    assert line.endswith(f"; contexts up to {longest:,} tokens fit")


def test_bench_reads_a_checkpoints_shape_for_its_memory(checkpoint, monkeypatch, capsys):
    # Two layers of the tiny shape: 512 bytes of keys and values a token.
    memory(monkeypatch, 10**6)
    longest = (10**6 - 2 * TOKEN_BYTES * 3) // (8 + 2 * TOKEN_BYTES)
    argv = ["bench", "--model", checkpoint, *BENCH[5:]]
    line = cli_error([*argv, "--contexts", str(longest + 1)], capsys)
    assert f"{longest + 1 + 3:,} tokens of 512 bytes" in line
    assert line.endswith(f"; contexts up to {longest:,} tokens fit")


def test_bench_batch_is_refused_exactly_when_its_prompts_and_cache_exceed_memory(
    monkeypatch, capsys, tmp_path
):
    line = cli_error([*BENCH, "--contexts", "32", "--batch", "100000000"], capsys)
    assert line.startswith("kvpop-compile bench: --batch 100000000: 100,000,000 sequences of 32 "
                           "tokens need at least ")  # fmt: skip
    # What the run needs, from what it measures: the cache it reports and the prompt ids.
    need = 3 * (32 * 8 + TOKEN_BYTES * (32 + 3))
    memory(monkeypatch, need)
    argv = [*BENCH, "--contexts", "32", "--batch", "3", "--out", str(tmp_path)]
    assert main(argv) == 0
    (row,) = json.loads((tmp_path / "long_context.json").read_text())["rows"]
    assert row["error"] is None and row["kv_bytes"] + 3 * 32 * 8 == need
    capsys.readouterr()
    memory(monkeypatch, need - 1)
    line = cli_error(argv, capsys)
    assert f"--batch 3: 3 sequences of 32 tokens need at least {need:,} bytes on cpu" in line
    assert line.endswith(f"{need - 1:,} bytes available there; at most 2 sequences of 32 tokens "
                         "fit")  # fmt: skip


@pytest.fixture
def exported(monkeypatch):
    """Record the calls ``kvpop-compile export`` makes to ``kc.export`` instead of exporting."""
    calls = []

    @functools.wraps(kvpop_compile.engines.export)  # its defaults are the CLI's
    def export(model, path, format, *, batch, prefill_length):
        calls.append({"batch": batch, "prefill_length": prefill_length})
        return path

    monkeypatch.setattr(kvpop_compile.engines, "export", export)
    return calls


def test_export_batch_is_refused_when_its_caches_exceed_memory(
    checkpoint, exported, monkeypatch, capsys, tmp_path
):
    argv = ["export", "--model", checkpoint, "--out", tmp_path / "engine", *BUDGET]
    line = cli_error([*argv, "--batch", "100000000"], capsys)
    assert line.startswith("kvpop-compile export: --batch 100000000: 100,000,000 sequences need "
                           "at least ")  # fmt: skip
    # A sequence's share, measured: the cache a real forward allocates and the warm-up's 2 ids.
    model = kc.transform(tiny_qwen3(max_position_embeddings=300), kc.KVpopConfig(
        sinks=2, window=4, topk=10))  # fmt: skip
    cache = kc.new_cache(model)
    with torch.no_grad():
        model(input_ids=torch.zeros(1, 2, dtype=torch.int64), cache=cache, use_cache=True)
    per_sequence = cache.nbytes + 2 * 8
    assert f"(caches and prompt ids, {per_sequence:,} bytes a sequence)" in line
    memory(monkeypatch, 5 * per_sequence)
    assert main([str(a) for a in [*argv, "--batch", "5"]]) == 0
    assert exported == [{"batch": 5, "prefill_length": None}]
    memory(monkeypatch, 5 * per_sequence - 1)
    line = cli_error([*argv, "--batch", "5"], capsys)
    assert "--batch 5: 5 sequences need at least" in line
    assert line.endswith("at most 4 sequences fit")
    assert len(exported) == 1


def test_export_prefill_beyond_the_models_positions_is_refused(
    checkpoint, exported, capsys, tmp_path
):
    argv = ["export", "--model", checkpoint, "--out", tmp_path / "engine", *BUDGET]
    for length in (100000000, 301):
        line = cli_error([*argv, "--prefill-length", length], capsys)
        assert line == (
            f"kvpop-compile export: --prefill-length {length}: the model has 300 positions "
            f"(max_position_embeddings in {checkpoint / 'config.json'}); give --prefill-length "
            "2 to 300"
        )
    assert main([str(a) for a in [*argv, "--prefill-length", "300"]]) == 0
    assert exported == [{"batch": 1, "prefill_length": 300}]


@pytest.fixture
def demo_runs(monkeypatch):
    """Record the demo's runs instead of running it."""
    runs = []

    @functools.wraps(kvpop_compile.evaluation.demo.run_demo)  # its defaults are the CLI's
    def run_demo(**arguments):
        runs.append(arguments)
        return types.SimpleNamespace(report=lambda: [])

    monkeypatch.setattr(kvpop_compile.evaluation.demo, "run_demo", run_demo)
    return runs


@pytest.mark.parametrize("context", [1024, 2048])
def test_demo_items_beyond_the_held_out_code_are_refused(context, demo_runs, capsys):
    size = len(split_text("held_out"))
    limit = size // (len(TASKS) * context)  # items per task whose code adds up to all of it
    for items in (100000000, limit + 1):
        line = cli_error(["demo", "--items", items, "--context", context, "--no-image"], capsys)
        assert line == (
            f"kvpop-compile demo: --items {items}: the held-out code is {size:,} bytes, as much "
            f"as {limit} items per task of {context} bytes for the {len(TASKS)} tasks hold; give "
            f"--items 1 to {limit}"
        )
    assert demo_runs == []
    assert main(["demo", "--items", str(limit), "--context", str(context), "--no-image"]) == 0
    assert [run["items"] for run in demo_runs] == [limit]


@pytest.fixture
def recall_runs(monkeypatch):
    """Record the settings ``eval --recall`` would run with instead of running it."""
    runs = []

    def evaluate_recall(model, out, *, settings, **_):
        runs.append(settings)
        return {"document": ""}

    monkeypatch.setattr(kvpop_compile.evaluation.recall, "evaluate_recall", evaluate_recall)
    return runs


@pytest.mark.parametrize(
    ("argv", "families"),
    [
        ([], ("train", "held_out")),  # never the validation families by default
        (["--recall-families", "held_out"], ("held_out",)),
        (["--recall-families", "validation,train"], ("validation", "train")),
        (["--recall-families", " held_out , train,validation"], ("held_out", "train",
                                                                 "validation")),
    ],
)  # fmt: skip
def test_recall_families_choose_the_family_groups_asked(argv, families, recall_runs, tmp_path):
    argv = ["eval", "--recall", "--policies", "window", "--budgets", "88%", "--out", str(tmp_path),
            "--recall-items", "3", *argv]  # fmt: skip
    assert main(argv) == 0
    (settings,) = recall_runs
    assert settings.families == families and settings.items == 3


@pytest.mark.parametrize(
    ("families", "message"),
    [
        ("heldout", "'heldout' is not one of train, validation, held_out"),
        ("train,", "'' is not one of train, validation, held_out"),
        ("held_out,train,held_out", "'held_out' is given twice in 'held_out,train,held_out'"),
    ],
)
def test_bad_recall_families_are_refused_before_anything_loads(
    families, message, recall_runs, capsys
):
    line = cli_error(["eval", "--recall", "--recall-families", families], capsys)
    assert line == f"kvpop-compile eval: argument --recall-families: {message}"
    assert recall_runs == []


@pytest.mark.parametrize(
    ("record", "shown"),
    [({"text": 5}, "int 5"), ({"text": None}, "NoneType None"),
     ({"text": ["a", "b"]}, "list ['a', 'b']")],
)  # fmt: skip
def test_training_records_whose_text_is_not_a_string_are_refused(
    record, shown, checkpoint, capsys, tmp_path
):
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"text": TEXTS[0]}) + "\n" + json.dumps(record) + "\n")
    line = cli_error(["train", "--model", checkpoint, "--data", data, "--out", tmp_path / "out",
                      "--tokenizer", "bytes", *BUDGET, "--scorer", "mlp"], capsys)  # fmt: skip
    assert line == f"kvpop-compile train: {data}:2: 'text' must be a string, got {shown}"


def test_train_without_tokenizer_files_says_so_and_the_checkpoint_names_the_cli_flags(
    checkpoint, capsys, tmp_path
):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "code.py").write_text(TEXTS[0][:6000])  # 62 sequences: 6 held out
    argv = ["train", "--model", checkpoint, "--data", tmp_path / "data", "--out", tmp_path / "out",
            "--sinks", "2", "--window", "8", "--topk", "16", "--steps", "2", "--seq-len", "96",
            "--batch-size", "2", "--eval-every", "2"]  # fmt: skip
    line = cli_error(argv, capsys)
    assert line.startswith(f"kvpop-compile train: --model {checkpoint}: no tokenizer found (none "
                           "of tokenizer.json, ")  # fmt: skip
    assert "pass --tokenizer bytes" in line
    argv = [str(a) for a in [*argv, "--tokenizer", "bytes"]]
    assert main(argv) == 0  # the flag it names
    capsys.readouterr()
    checkpoint_file = tmp_path / "out" / "checkpoint.pt"
    line = cli_error([*argv, "--lr", "0.01"], capsys)
    assert line == (
        f"kvpop-compile train: {checkpoint_file} is a checkpoint made with other settings (lr): "
        "pass --no-resume to start over (it is overwritten), or give another --out"
    )
    checkpoint_file.write_bytes(checkpoint_file.read_bytes()[:100])
    line = cli_error(argv, capsys)
    assert line.startswith(f"kvpop-compile train: {checkpoint_file} is a corrupt checkpoint (")
    assert line.endswith(": pass --no-resume to start over (it is overwritten), or give another "
                         "--out")  # fmt: skip
    assert main([*argv, "--lr", "0.01", "--no-resume"]) == 0
    assert "step 2: held-out loss" in capsys.readouterr().out
    saved = torch.load(checkpoint_file, weights_only=True)
    assert saved["settings"]["lr"] == 0.01 and saved["step"] == 2


def test_eval_of_an_empty_file_or_folder_says_it_has_no_text(checkpoint, capsys, tmp_path):
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "a.txt").write_text("")
    (tmp_path / "folder" / "b.bin").write_bytes(b"\0\1")
    expected = {
        "empty.txt": f"{tmp_path / 'empty.txt'} is empty (0 bytes): it has no text; give a "
        "file of text",
        "folder": f"no text in {tmp_path / 'folder'}: 1 of its files are empty (0 bytes), the "
        "other 1 binary or not UTF-8",
    }
    for name, message in expected.items():
        argv = ["eval", "--data", tmp_path / name, "--model", checkpoint, "--policies", "window",
                "--length", "296", "--budgets", "75%", "--out", tmp_path / "out"]  # fmt: skip
        line = cli_error(argv, capsys)
        assert line == f"kvpop-compile eval: {message}"


def test_empty_files_in_a_folder_are_skipped(tmp_path):
    text = "".join(TEXTS)[:1000]
    (tmp_path / "alone").mkdir()
    (tmp_path / "alone" / "b.txt").write_text(text)
    (tmp_path / "mixed").mkdir()
    (tmp_path / "mixed" / "a.txt").write_text("")
    (tmp_path / "mixed" / "b.txt").write_text(text)
    mixed = text_sequences(tmp_path / "mixed", UTF8_BYTES, length=100)
    alone = text_sequences(tmp_path / "alone", UTF8_BYTES, length=100)
    assert len(mixed.sequences) == len(alone.sequences) == 9
    for a, b in zip(mixed.sequences, alone.sequences, strict=True):
        assert a.source == b.source and torch.equal(a.ids, b.ids)
    assert mixed.notes == [f"1 empty files in {tmp_path / 'mixed'} skipped"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--target", "power_mean"],
         "target_power must be a number in (1, 1000] for target 'power_mean' (1 is the mean; "
         "for more, the max), got None"),
        (["--target", "power_mean", "--target-power", "1"],
         "target_power must be a number in (1, 1000] for target 'power_mean' (1 is the mean; "
         "for more, the max), got 1.0"),
        (["--target", "max", "--target-power", "4"],
         "target_power applies to target 'power_mean' only; got target_power 4.0 with target "
         "'max'"),
    ],
)  # fmt: skip
def test_a_target_power_that_does_not_fit_the_target_is_refused_before_the_model_loads(
    flags, message, checkpoint, capsys, tmp_path, monkeypatch
):
    import kvpop_compile.cli.commands as commands

    def load(*_):
        raise AssertionError("the model loaded before the settings were checked")

    monkeypatch.setattr(commands, "_budget_and_model", load)
    line = cli_error(["train", "--model", checkpoint, "--data", tmp_path, "--out", tmp_path / "o",
                      "--tokenizer", "bytes", *flags], capsys)  # fmt: skip
    assert line == f"kvpop-compile train: {message}"
    assert not (tmp_path / "o").exists()
