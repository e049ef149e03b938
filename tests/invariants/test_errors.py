"""Errors that reach the user: every CLI verb and public function refuses bad input with one
clear line naming the bad value and what is allowed, never a traceback from deep inside."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cli_support import cli_error
from tiny_models import tiny_qwen3

import kvpop_compile as kc
from kvpop_compile.evaluation import EvalSettings

BUDGET = ["--sinks", "2", "--window", "4", "--topk", "10"]
TRAIN_CONFIG = kc.KVpopConfig(sinks=2, window=4, topk=10, scorer="mlp")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("checkpoint")
    tiny_qwen3().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def model():
    return kc.transform(tiny_qwen3(), kc.KVpopConfig(sinks=2, window=4, topk=10))


def test_export_of_a_missing_model_prints_one_line():
    # The installed entry point, in a fresh process: what a user sees.
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-m", "kvpop_compile", "export", "--model", "/nonexistent", "--out",
         "/nonexistent-engine"],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(root)},
    )  # fmt: skip
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (
        "kvpop-compile export: argument --model: '/nonexistent' is not a folder; give a local "
        "Hugging Face checkpoint folder (config.json and the weights)\n"
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["export", "--model", "/nonexistent", "--out", "E"], "'/nonexistent' is not a folder"),
        (["export", "--model", "EMPTY", "--out", "E"], "has no config.json"),
        (["export", "--model", "CKPT", "--out", "E", "--batch", "0"],
         "argument --batch: must be an integer >= 1, got '0'"),
        (["export", "--model", "CKPT", "--out", "E", "--prefill-length", "1"],
         "argument --prefill-length: must be an integer >= 2, got '1'"),
        (["export", "--model", "CKPT", "--out", "E", "--window", "four"],
         "argument --window: must be an integer >= 1, got 'four'"),
        (["export", "--model", "CKPT", "--out", "E", "--lam", "nan"],
         "argument --lam: must be a finite number >= 0, got 'nan'"),
        (["export", "--model", "CKPT", "--out", "E", "--format", "tflite"],
         "argument --format: invalid choice: 'tflite'"),
        (["export", "--out", "E"], "the following arguments are required: --model"),
        (["export", "--model", "CKPT", "--out", "E", "--priority-span", "-1"],
         "argument --priority-span: must be an integer >= 0, got '-1'"),
        (["eval", "--priority-span", "x"], "argument --priority-span: must be an integer >= 0"),
        (["train", "--model", "/nonexistent", "--data", "D", "--out", "O"], "is not a folder"),
        (["train", "--model", "CKPT", "--data", "D", "--out", "O", "--lr", "0"],
         "argument --lr: must be a finite number > 0, got '0'"),
        (["train", "--model", "CKPT", "--data", "D", "--out", "O", "--eval-every", "0"],
         "argument --eval-every: must be an integer >= 1, got '0'"),
        (["train", "--model", "CKPT", "--data", "D", "--out", "O", "--seq-len", "-5"],
         "argument --seq-len: must be an integer >= 2, got '-5'"),
        (["demo", "--items", "0"], "argument --items: must be an integer >= 1, got '0'"),
        (["eval", "--recall-lengths", "1024,512"],
         "argument --recall-lengths: '512' is not one of 1024, 2048"),
        (["eval", "--recall-protocols", "prefil"],
         "argument --recall-protocols: 'prefil' is not one of prefill, decode"),
        (["eval", "--recall-lengths", "2048,2048"],
         "argument --recall-lengths: '2048' is given twice in '2048,2048'"),
        (["eval", "--recall-families", "train,test"],
         "argument --recall-families: 'test' is not one of train, validation, held_out"),
        (["demo", "--model", "/nonexistent"], "argument --model: '/nonexistent' is not a folder"),
        (["eval", "--resume"], "--resume goes on with a recall run (--recall without "
         "--report-only); add --recall"),
        (["eval", "--recall", "--report-only", "--resume"], "--report-only runs no method"),
        (["eval", "--batch", "0"], "argument --batch: must be an integer >= 1, got '0'"),
        (["eval", "--threads", "0"], "argument --threads: must be an integer >= 1, got '0'"),
        (["eval", "--sequences", "0"], "argument --sequences: must be an integer >= 1, got '0'"),
        (["eval", "--model", "/nonexistent"], "argument --model: '/nonexistent' is not a folder"),
        (["frobnicate"], "argument command: invalid choice: 'frobnicate'"),
    ],
)  # fmt: skip
def test_cli_arguments_are_checked_before_anything_loads(argv, message, capsys, tmp_path):
    (tmp_path / "EMPTY").mkdir()
    (tmp_path / "CKPT").mkdir()
    (tmp_path / "CKPT" / "config.json").write_text("{}")  # never read: parsing fails first
    names = {"EMPTY": tmp_path / "EMPTY", "CKPT": tmp_path / "CKPT"}
    line = cli_error([names.get(a, a) for a in argv], capsys)
    assert line.startswith("kvpop-compile") and message in line


def test_cli_reports_errors_raised_while_running_in_one_line(checkpoint, capsys, tmp_path):
    out = ["--out", tmp_path / "engine"]
    line = cli_error(["export", "--model", checkpoint, *out, "--scorer-path", tmp_path, *BUDGET],
                     capsys)  # fmt: skip
    assert line.startswith(f"kvpop-compile export: {tmp_path / 'scorer.json'} not found")
    # A checkpoint folder without weights: transformers raises OSError.
    config_only = tmp_path / "config-only"
    tiny_qwen3().config.save_pretrained(config_only)
    line = cli_error(["export", "--model", config_only, *out, *BUDGET], capsys)
    assert line.startswith("kvpop-compile export: ") and str(config_only) in line


@pytest.mark.parametrize("implementation", ["static", "offloaded_static"])
def test_static_cache_implementation_says_what_to_do(model, implementation):
    ids = torch.zeros(1, 5, dtype=torch.int64)
    with pytest.raises(ValueError, match="call generate\\(\\) without cache_implementation"):
        model.generate(ids, max_new_tokens=2, cache_implementation=implementation)
    assert model.generate(ids, max_new_tokens=2).shape == (1, 7)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda m, p: kc.export(m, None, "onnx"), TypeError,
         "path must be a str or os.PathLike, got NoneType"),
        (lambda m, p: kc.export(m, p, "onnx", batch="2"), ValueError,
         "batch must be an integer >= 1, got '2'"),
        (lambda m, p: kc.export(m, p, "aoti", prefill_length=1.5), ValueError,
         r"prefill_length \(or None\) must be an integer >= 2, got 1.5"),
        (lambda m, p: kc.load(None), TypeError, "path must be a str or os.PathLike, got NoneType"),
        (lambda m, p: kc.load(p, config={"window": 4}), TypeError,
         "config must be a KVpopConfig or None, got dict"),
        (lambda m, p: kc.save_scorer(m, None), TypeError,
         "path must be a str or os.PathLike folder, got NoneType"),
        (lambda m, p: kc.load_scorer(m, 5), TypeError,
         "path must be a str or os.PathLike folder, got int"),
        (lambda m, p: EvalSettings(batch=0), ValueError, "batch must be an integer >= 1, got 0"),
        (lambda m, p: EvalSettings(threads=0), ValueError,
         r"threads \(or None\) must be an integer >= 1, got 0"),
        (lambda m, p: EvalSettings(protocols=("perplexity",)), ValueError,
         "protocols must be a non-empty sequence of teacher_forced, continuation, compression"),
    ],
)  # fmt: skip
def test_public_functions_name_the_bad_value(model, tmp_path, call, error, message):
    with pytest.raises(error, match=message):
        call(model, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("settings", "error", "message"),
    [
        ({"lr": -1.0}, ValueError, "lr must be a finite number > 0, got -1.0"),
        ({"lr": float("nan")}, ValueError, "lr must be a finite number > 0, got nan"),
        ({"tau": 0}, ValueError, "tau must be a finite number > 0, got 0"),
        ({"kl_weight": float("inf")}, ValueError, "kl_weight must be a finite number >= 0"),
        ({"eval_every": 0}, ValueError, "eval_every must be an integer >= 1, got 0"),
        ({"checkpoint_every": 0}, ValueError, "checkpoint_every must be an integer >= 1, got 0"),
        ({"steps": "3"}, ValueError, "steps must be an integer >= 1, got '3'"),
        ({"seq_len": 64.0}, ValueError, "seq_len must be an integer >= 1, got 64.0"),
        ({"data": 5}, TypeError, "data must be a path .* or a list of strings; got int"),
        ({"data": [b"bytes"]}, TypeError, "got a list holding bytes"),
    ],
)  # fmt: skip
def test_train_scorer_names_the_bad_setting(tmp_path, settings, error, message):
    arguments = {"data": ["x = 1\n" * 200], "seq_len": 64, "steps": 1, **settings}
    data = arguments.pop("data")
    with pytest.raises(error, match=message):
        kc.train_scorer(
            tiny_qwen3(), data, TRAIN_CONFIG, kc.TrainSettings(**arguments),
            output_dir=tmp_path / "run", progress=False,
        )  # fmt: skip
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"loss": "hinge"}, "loss must be one of boundary, gap, regression, quantile; got 'hinge'"),
        ({"mode": "rl"}, "mode must be one of scorer, distill; got 'rl'"),
        ({"trainable": "mlp"}, "trainable must be a list of parameter-name parts or None"),
        ({"eval_fraction": 1.0}, r"eval_fraction must be in \(0, 1\), got 1.0"),
        ({"resume": "yes"}, "resume must be True or False, got 'yes'"),
    ],
)
def test_train_settings_name_the_bad_value(settings, message):
    with pytest.raises(ValueError, match=message):
        kc.TrainSettings(**settings)


def test_train_scorer_takes_its_settings_as_one_object(tmp_path):
    with pytest.raises(TypeError, match="settings must be a TrainSettings or None, got dict"):
        kc.train_scorer(tiny_qwen3(), ["x"], TRAIN_CONFIG, {"steps": 3}, output_dir=tmp_path)
    with pytest.raises(TypeError, match="unexpected keyword argument 'stpes'"):
        kc.TrainSettings(stpes=3)
