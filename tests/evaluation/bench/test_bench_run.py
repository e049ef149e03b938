"""``kvpop-compile bench``: the long-context benchmark end to end on a tiny model, its report,
a run that fails without ending the others, and the arguments it refuses."""

from __future__ import annotations

import json
import statistics
import sys

import pytest
import torch
from cli_support import cli_error
from tiny_models import tiny_qwen3
from transformers import LlamaConfig

import kvpop_compile as kc
from kvpop_compile.cli import main
from kvpop_compile.evaluation.bench import timing
from kvpop_compile.evaluation.bench.model_shapes import MODELS, qwen3_model
from kvpop_compile.evaluation.bench.report import bench_markdown, write_bench
from kvpop_compile.evaluation.bench.run import bench_model, run_bench
from kvpop_compile.evaluation.bench.settings import BenchSettings

BUDGET = kc.KVpopConfig(sinks=2, window=8, topk=22)  # capacity 32: both contexts evict


BUDGET_ARGS = ["--sinks", "2", "--window", "8", "--topk", "22"]


TINY = ["bench", "--shape", "tiny", "--layers", "1", "--device", "cpu", "--contexts", "32,64",
        "--methods", "dynamic,eager", "--decode-tokens", "2", "--warmup", "1",
        *BUDGET_ARGS]  # fmt: skip


def _rows(data: dict) -> dict[tuple[int, str], dict]:
    return {(row["context"], row["method"]): row for row in data["rows"]}


def test_cli_writes_the_table_the_figures_and_the_plot(tmp_path):
    assert main([*TINY, "--out", str(tmp_path / "out")]) == 0
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == [
        "long_context.json", "long_context.md", "long_context.png"]  # fmt: skip
    assert (out / "long_context.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads((out / "long_context.json").read_text())
    rows = _rows(data)
    assert set(rows) == {(n, m) for n in (32, 64) for m in ("dynamic", "eager")}
    for row in rows.values():
        assert row["error"] is None
        assert row["prefill_s"] > 0 and len(row["step_s"]) == 2 and row["peak_bytes"] is not None
        assert row["decode_tok_s"] == pytest.approx(1 / statistics.median(row["step_s"]))
    for n in (32, 64):
        dynamic, eager = rows[n, "dynamic"], rows[n, "eager"]
        assert dynamic["decode_vs_dynamic"] == dynamic["prefill_vs_dynamic"] == 1.0
        assert eager["prefill_vs_dynamic"] == pytest.approx(
            eager["prefill_s"] / dynamic["prefill_s"]
        )
        assert eager["decode_vs_dynamic"] == pytest.approx(
            eager["decode_tok_s"] / dynamic["decode_tok_s"]
        )
        assert eager["peak_vs_dynamic"] == pytest.approx(
            eager["peak_bytes"] / dynamic["peak_bytes"]
        )
    # The full cache holds every token, the prompt's and the 3 decoded (one layer: 2 KV heads
    # of 16 float32 keys and values, 256 bytes a token); KVpop's its capacity at both lengths.
    for n in (32, 64):
        assert rows[n, "dynamic"]["kv_bytes"] == 256 * (n + 3)
    assert rows[64, "eager"]["kv_bytes"] == rows[32, "eager"]["kv_bytes"]
    assert data["layers"] == 1 and data["settings"]["kvpop_config"]["topk"] == 22
    report = (out / "long_context.md").read_text()
    assert "| N | method | prefill s | decode tok/s | peak MiB |" in report
    for n in (32, 64):
        assert f"| {n} | dynamic cache | " in report and f"| {n} | KVpop eager | " in report
    assert "![prefill, decode and memory against N](long_context.png)" in report


@pytest.fixture(scope="module")
def failed_static(tmp_path_factory):
    """A run whose static cache runs out of memory (as it would at a long context on a GPU)."""

    def out_of_memory(**kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(timing, "StaticCache", out_of_memory)
    settings = BenchSettings(contexts=(40,), methods=("eager", "static", "dynamic", "graph"),
                             decode_tokens=2, warmup=1, kvpop_config=BUDGET)  # fmt: skip
    model = qwen3_model("tiny", layers=1, vocab=256, max_positions=256)
    try:
        result = run_bench(model, settings, model_name="tiny", progress=False)
    finally:
        monkeypatch.undo()  # at once: the module's other tests run the real static cache
    return result


def test_a_failed_run_is_reported_in_its_row_and_the_others_go_on(failed_static):
    result = failed_static
    assert [row.method for row in result.rows] == ["dynamic", "static", "eager", "graph"]
    static = result.row(40, "static")
    assert static.error == "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    # A CUDA graph cannot be captured on this CPU: its row says why.
    assert "cuda_graph=True needs the model on a CUDA device" in result.row(40, "graph").error
    assert static.prefill_s is None and result.ratios(static)["decode"] is None
    assert result.row(40, "eager").error is None and result.row(40, "eager").step_s
    report = bench_markdown(result)
    assert "| 40 | static cache + torch.compile | failed: OutOfMemoryError: CUDA out of" in report


def test_without_matplotlib_the_tables_are_written_and_say_so(failed_static, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now fails
    files = write_bench(failed_static, tmp_path)
    assert [f.name for f in files] == ["long_context.md", "long_context.json"]
    assert "Plot skipped: matplotlib is not installed" in (tmp_path / "long_context.md").read_text()
    assert not list(tmp_path.glob("*.png")) and not list(tmp_path.glob(".*"))


def test_a_batch_decodes_every_sequence_with_its_own_cache(tmp_path):
    argv = [*TINY, "--contexts", "32", "--methods", "dynamic,static,eager", "--batch", "3"]
    assert main([*argv, "--out", str(tmp_path / "out")]) == 0
    data = json.loads((tmp_path / "out" / "long_context.json").read_text())
    rows = _rows(data)
    assert data["settings"]["batch"] == 3
    for row in rows.values():
        assert row["error"] is None and row["batch"] == 3
        assert row["decode_tok_s"] == pytest.approx(3 / statistics.median(row["step_s"]))
    # Three full caches of 32 + 3 tokens (256 bytes a token, as above).
    assert rows[32, "dynamic"]["kv_bytes"] == 3 * 256 * (32 + 3)
    assert "batch 3 on" in (tmp_path / "out" / "long_context.md").read_text()
    with pytest.raises(ValueError, match="batch must be an integer >= 1, got 0"):
        BenchSettings(contexts=(32,), batch=0)


def test_a_transformed_or_foreign_model_is_refused_before_anything_runs():
    settings = BenchSettings(contexts=(32,), kvpop_config=BUDGET)
    with pytest.raises(ValueError, match="the model is already transformed"):
        run_bench(kc.transform(tiny_qwen3(), BUDGET), settings, model_name="tiny")
    with pytest.raises(ValueError, match="give a checkpoint path or a shape, not both"):
        bench_model(path="x", shape="tiny", settings=settings)
    assert set(MODELS) >= {"qwen3-0.6b", "qwen3-4b", "tiny"}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--shape", "qwen3-5b"], "argument --shape: invalid choice: 'qwen3-5b'"),
        (["--shape", "tiny", "--contexts", "8q"], "argument --contexts: context '8q' is not a "
         "token count"),
        (["--shape", "tiny", "--methods", "flash"], "argument --methods: unknown method 'flash'; "
         "choose from dynamic, static, eager, compile, graph, aoti"),
        (["--shape", "tiny", "--device", "tpu"], "argument --device: must be cuda, cuda:N or "
         "cpu, got 'tpu'"),
        (["--shape", "tiny", "--decode-tokens", "0"], "argument --decode-tokens: must be an "
         "integer >= 1, got '0'"),
        (["--shape", "tiny", "--layers", "0"], "argument --layers: must be an integer >= 1"),
        ([], "one of the arguments --model --shape is required"),
        (["--shape", "tiny", "--model", "/nonexistent"], "is not a folder"),
        (["--model", "CKPT", "--layers", "2"], "--layers 2 cuts a --shape model"),
        (["--model", "LLAMA"], "the benchmark runs Qwen3 models (model_type qwen3, qwen3_moe), "
         "got LlamaConfig with model_type 'llama'"),
    ],
)  # fmt: skip
def test_bad_arguments_end_in_one_line(argv, message, capsys, tmp_path):
    (tmp_path / "CKPT").mkdir()
    (tmp_path / "CKPT" / "config.json").write_text("{}")  # never read: refused first
    LlamaConfig(num_hidden_layers=1).save_pretrained(tmp_path / "LLAMA")  # no weights needed
    names = {"CKPT": tmp_path / "CKPT", "LLAMA": tmp_path / "LLAMA"}
    line = cli_error(["bench", *(names.get(a, a) for a in argv)], capsys)
    assert line.startswith("kvpop-compile bench: ") and message in line


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_cuda_asked_for_without_a_gpu_is_refused(capsys):
    line = cli_error(["bench", "--shape", "tiny", "--device", "cuda"], capsys)
    assert line == (
        "kvpop-compile bench: argument --device: 'cuda' is not available here "
        "(torch.cuda.is_available() is False); use --device cpu"
    )
