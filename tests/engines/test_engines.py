"""export() and load(): AOTInductor and ONNX engines generate like the eager model, run in a
fresh process, and refuse damaged or mismatched folders."""

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from tiny_models import prompt, tiny_qwen3

import kvpop_compile as kc
from kvpop_compile.engines.manifest import read_manifest
from kvpop_compile.engines.onnx_engine import TENSORRT_ONNX_OPS
from kvpop_compile.fingerprints import weights_sha256

CONFIG = kc.KVpopConfig(sinks=2, window=4, topk=10, scorer="memory")  # capacity 16 << 300
PROMPT_LENGTH = 12


@pytest.fixture(scope="module")
def model():
    return kc.transform(tiny_qwen3(), CONFIG)


@pytest.fixture(scope="module")
def engines(model, tmp_path_factory):
    root = tmp_path_factory.mktemp("engines")
    return {
        "aoti": kc.export(model, root / "aoti", "aoti", prefill_length=PROMPT_LENGTH),
        "onnx": kc.export(model, root / "onnx", "onnx"),
    }


def run_python(code: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.mark.parametrize("format", ["aoti", "onnx"])
def test_engine_in_a_fresh_process_generates_the_eager_tokens(model, engines, format, tmp_path):
    ids = prompt(length=PROMPT_LENGTH, batch=1)
    expected = kc.generate(model, ids, 300)
    torch.save(ids, tmp_path / "ids.pt")
    run_python(f"""
        import torch, kvpop_compile as kc
        runner = kc.load({str(engines[format])!r})
        ids = torch.load({str(tmp_path / "ids.pt")!r})
        torch.save(runner.generate(ids, 300), {str(tmp_path / "out.pt")!r})
    """)
    assert torch.equal(torch.load(tmp_path / "out.pt"), expected)


def test_an_engine_with_spread_scores_generates_the_eager_tokens(tmp_path):
    """``priority_span``'s last scores travel as one more state tensor of the exported graph."""
    spread = kc.transform(tiny_qwen3(), dataclasses.replace(CONFIG, priority_span=3))
    ids = prompt(length=PROMPT_LENGTH, batch=1)
    runner = kc.load(kc.export(spread, tmp_path / "onnx", "onnx"))
    assert torch.equal(runner.generate(ids, 60), kc.generate(spread, ids, 60))


def test_aoti_engine_prefills_in_chunks_of_its_prefill_length(model, engines):
    """Prompts of the prefill length, shorter (decode steps) and longer than the capacity (two
    prefill chunks continuing the cache, then decode steps for the rest)."""
    runner = kc.load(engines["aoti"])
    assert runner.manifest["steps"] == ["decode", "prefill"]
    for length in (PROMPT_LENGTH, 5, 2 * PROMPT_LENGTH + 5):
        ids = prompt(seed=length, length=length, batch=1)
        assert torch.equal(runner.generate(ids, 40), kc.generate(model, ids, 40))


def test_aoti_package_runs_without_importing_kvpop_compile(model, engines):
    folder = engines["aoti"]
    ids = prompt(length=3, batch=1)
    cache = kc.new_cache(model)
    kc.prefill(model, ids[:, :2], cache)
    with torch.no_grad():
        expected = kc.decode_one_token(model, ids[:, 2:], torch.tensor([[2]]), cache)
    torch.save(
        [ids[:, :2], ids[:, 2:]], folder.parent / "tokens.pt"
    )  # the prompt and the next token
    out = run_python(f"""
        import json, sys, torch
        folder = {str(folder)!r}
        manifest = json.load(open(folder + "/manifest.json"))
        fill = {{"positions": -1, "priorities": float("-inf")}}
        state = [torch.full(s["shape"], fill.get(s["name"].split(".")[-1], 0),
                            dtype=getattr(torch, s["dtype"])) for s in manifest["state"]]
        decode = torch._inductor.aoti_load_package(folder + "/decode.pt2")
        prompt, token = torch.load({str(folder.parent / "tokens.pt")!r})
        for i in range(prompt.shape[1]):
            decode(prompt[:, i : i + 1], *state)
        logits = decode(token, *state)[0]
        torch.save(logits, {str(folder.parent / "logits.pt")!r})
        print("kvpop_compile" in sys.modules)
    """)
    assert out.strip() == "False"
    torch.testing.assert_close(torch.load(folder.parent / "logits.pt"), expected)


def test_onnx_decode_returns_the_updated_cache(model, engines):
    import onnx

    graph = onnx.load(str(engines["onnx"] / "decode.onnx")).graph
    manifest = read_manifest(engines["onnx"])
    state_count = len(manifest["state"])
    assert len(graph.input) == len(graph.output) == 1 + state_count
    # A cache kept as mutated buffers would vanish from the graph; here one step must advance
    # every layer's position counter and change the cached keys.
    runner = kc.load(engines["onnx"])
    before = [t.clone() for t in runner.state]
    runner.decode(torch.tensor([[7]]))
    names = [spec["name"] for spec in manifest["state"]]
    for name, old, new in zip(names, before, runner.state, strict=True):
        if name.endswith(".seen"):
            assert int(new) == int(old) + 1
        if name.endswith(".keys"):
            assert not torch.equal(new, old)


def test_onnx_uses_only_operators_tensorrt_parses(engines):
    import onnx

    graph = onnx.load(str(engines["onnx"] / "decode.onnx")).graph
    used = {node.op_type for node in graph.node}
    assert used <= TENSORRT_ONNX_OPS, used - TENSORRT_ONNX_OPS


def test_manifest_describes_the_engine(model, engines):
    manifest = read_manifest(engines["aoti"])
    assert manifest["format"] == "aoti" and manifest["batch"] == 1
    assert manifest["kvpop_config"]["topk"] == 10 and manifest["kvpop_config"]["scorer"] == "memory"
    assert manifest["model"]["num_hidden_layers"] == 2 and manifest["model"]["dtype"] == "float32"
    assert manifest["torch_version"] == torch.__version__
    assert set(manifest["files"]) == {"decode.pt2", "prefill.pt2"}
    keys = next(s for s in manifest["state"] if s["name"] == "layers.0.keys")
    assert keys["shape"] == [1, 2, CONFIG.capacity, 16]


def damaged_copy(engines, tmp_path, damage, format="onnx"):
    folder = tmp_path / "engine"
    shutil.copytree(engines[format], folder)
    damage(folder)
    return folder


def test_damaged_or_mismatched_engines_are_refused(model, engines, tmp_path):
    def truncate(folder):
        data = (folder / "decode.onnx").read_bytes()
        (folder / "decode.onnx").write_bytes(data[: len(data) // 2])

    with pytest.raises(ValueError, match="decode.onnx is corrupted or truncated"):
        kc.load(damaged_copy(engines, tmp_path / "a", truncate))
    with pytest.raises(FileNotFoundError, match="decode.onnx is missing"):
        kc.load(damaged_copy(engines, tmp_path / "b", lambda f: (f / "decode.onnx").unlink()))

    def other_version(folder):
        manifest = json.loads((folder / "manifest.json").read_text())
        manifest["library_version"] = "0.0.1"
        (folder / "manifest.json").write_text(json.dumps(manifest))

    with pytest.raises(ValueError, match="exported by kvpop_compile '0.0.1', this is"):
        kc.load(damaged_copy(engines, tmp_path / "c", other_version))
    with pytest.raises(FileNotFoundError, match="is not an exported engine"):
        kc.load(tmp_path)
    with pytest.raises(
        ValueError, match="engine mismatch: exported with topk=10, expected topk=20"
    ):
        kc.load(engines["onnx"], config=kc.KVpopConfig(sinks=2, window=4, topk=20))
    with pytest.raises(ValueError, match="engine mismatch: exported for a model with vocab_size"):
        kc.load(engines["onnx"], model=tiny_qwen3(vocab_size=300))
    kc.load(engines["onnx"], config=CONFIG, model=model)


def flip_one_byte(file: Path) -> None:
    """Same length, one byte changed in the middle: only the hash can tell."""
    data = bytearray(file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    file.write_bytes(bytes(data))


@pytest.mark.parametrize("format", ["aoti", "onnx"])
def test_every_engine_file_is_hash_checked(engines, format, tmp_path):
    """Each file of the folder, damaged alone (an AOTI engine's prefill package as well as its
    decode package), is refused by name: the manifest lists every file and checks them all."""
    listed = sorted(read_manifest(engines[format])["files"])
    on_disk = sorted(p.name for p in engines[format].iterdir() if p.name != "manifest.json")
    assert listed == on_disk
    assert len(listed) == {"aoti": 2, "onnx": 1}[format]
    for name in listed:
        damage = lambda folder, name=name: flip_one_byte(folder / name)  # noqa: E731
        folder = damaged_copy(engines, tmp_path / name, damage, format=format)
        with pytest.raises(ValueError, match=f"{name} is corrupted or truncated"):
            kc.load(folder)


def edit_manifest(change):
    def damage(folder):
        manifest = json.loads((folder / "manifest.json").read_text())
        change(manifest)
        (folder / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))

    return damage


def test_an_edited_manifest_is_refused(engines, tmp_path):
    # The engine still runs window 4 and batch 1 whatever the manifest is edited to say.
    window_8 = edit_manifest(lambda m: m["kvpop_config"].update(window=8))
    edited = kc.KVpopConfig(sinks=2, window=8, topk=10, scorer="memory")
    with pytest.raises(ValueError, match="manifest.json was edited or corrupted"):
        kc.load(damaged_copy(engines, tmp_path / "a", window_8), config=edited)
    batch_2 = edit_manifest(lambda m: m.update(batch=2))
    with pytest.raises(ValueError, match="manifest.json was edited or corrupted"):
        kc.load(damaged_copy(engines, tmp_path / "b", batch_2))
    # Rewriting the same content in another layout is not an edit.
    kc.load(damaged_copy(engines, tmp_path / "c", edit_manifest(lambda m: None)))


def test_load_refuses_a_model_with_other_weights(model, engines):
    assert read_manifest(engines["onnx"])["weights_sha256"] == weights_sha256(model)
    other_llm = kc.transform(tiny_qwen3(seed=1), CONFIG)
    with pytest.raises(ValueError, match="engine mismatch: exported from other weights"):
        kc.load(engines["onnx"], model=other_llm)
    other_scorer = kc.transform(tiny_qwen3(), CONFIG)
    with torch.no_grad():
        other_scorer.model.layers[1].self_attn.scorer.w_key.add_(1e-3)
    with pytest.raises(ValueError, match="engine mismatch: exported from other weights"):
        kc.load(engines["onnx"], model=other_scorer)
    kc.load(engines["onnx"], model=kc.transform(tiny_qwen3(), CONFIG))  # equal weights


def test_runner_refuses_bad_ids_before_running_the_engine(engines):
    runner = kc.load(engines["onnx"])
    calls = []
    runner.steps = {name: lambda inputs, name=name: calls.append(name) for name in runner.steps}
    with pytest.raises(ValueError, match="token ids must be integers, got torch.float32"):
        runner.generate(torch.tensor([[1.0, 2.7]]), 3)
    with pytest.raises(ValueError, match="token ids must be integers, got torch.bool"):
        runner.decode(torch.tensor([[True]]))
    with pytest.raises(ValueError, match=r"exported for batch 1\), got \(2, 3\)"):
        runner.prefill(torch.zeros(2, 3, dtype=torch.int64))
    with pytest.raises(TypeError, match="token ids must be a torch.Tensor, got list"):
        runner.decode([[1]])
    assert calls == []


@pytest.mark.parametrize("format", ["aoti", "onnx"])
def test_cuda_graph_is_refused_where_it_cannot_run(engines, format):
    # A CPU engine (and any ONNX engine) has no CUDA graph to capture; the refusal says why.
    with pytest.raises(ValueError, match=f"needs an AOTInductor engine exported on a CUDA "
                       f"device; this one is '{format}' on cpu"):  # fmt: skip
        kc.load(engines[format], cuda_graph=True)
    with pytest.raises(TypeError, match="cuda_graph must be True or False, got 1"):
        kc.load(engines[format], cuda_graph=1)


def test_export_refusals(model, tmp_path):
    with pytest.raises(ValueError, match="is not transformed: call kvpop_compile.transform"):
        kc.export(tiny_qwen3(), tmp_path / "x", "onnx")
    with pytest.raises(
        ValueError, match="format must be one of aoti, onnx, tensorrt; got 'tflite'"
    ):
        kc.export(model, tmp_path / "x", "tflite")
    with pytest.raises(ValueError, match="the onnx format exports the decode step only"):
        kc.export(model, tmp_path / "x", "onnx", prefill_length=8)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="is not an engine folder"):
        kc.export(model, tmp_path / "taken", "onnx")
    assert (tmp_path / "taken" / "notes.txt").read_text() == "keep me"


def test_reexport_replaces_an_engine_folder(model, tmp_path):
    first = kc.export(model, tmp_path / "engine", "onnx")
    stamp = read_manifest(first)["files"]
    second = kc.export(model, tmp_path / "engine", "onnx", batch=2)
    assert read_manifest(second)["batch"] == 2 and set(read_manifest(second)["files"]) == set(stamp)
    assert [p.name for p in tmp_path.iterdir()] == ["engine"]  # no staging folder left


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the message shown where TensorRT cannot run"
)
def test_tensorrt_without_gpu_names_the_extra(model, tmp_path):
    with pytest.raises(ImportError, match=r"pip install 'kvpop_compile\[tensorrt\]'|CUDA GPU"):
        kc.export(model, tmp_path / "trt", "tensorrt")
    with pytest.raises(ImportError, match="backend='tensorrt' needs"):
        kc.compile(model, backend="tensorrt")
    assert not (tmp_path / "trt").exists()


def test_cli_exports_a_local_checkpoint(tmp_path, capsys):
    from kvpop_compile.cli import main

    checkpoint = tmp_path / "checkpoint"
    tiny_qwen3().save_pretrained(checkpoint)
    args = ["export", "--model", str(checkpoint), "--out", str(tmp_path / "engine"),
            "--format", "onnx", "--sinks", "2", "--window", "4", "--topk", "10"]  # fmt: skip
    assert main(args) == 0
    assert "wrote onnx engine to" in capsys.readouterr().out
    runner = kc.load(tmp_path / "engine", config=kc.KVpopConfig(sinks=2, window=4, topk=10))
    assert runner.generate(prompt(length=4, batch=1), 3).shape == (1, 7)
    with pytest.raises(SystemExit) as exit:
        main(args[:-2] + ["--topk", "-1"])
    assert exit.value.code == 2
    assert "argument --topk: must be an integer >= 0, got '-1'" in capsys.readouterr().err


def test_an_engine_with_a_per_layer_budget_generates_the_eager_tokens(tmp_path):
    """Each layer's state tensors have that layer's capacity in the exported graph."""
    per_layer = kc.transform(tiny_qwen3(), dataclasses.replace(CONFIG, window=(4, 6), topk=(10, 3)))
    ids = prompt(length=PROMPT_LENGTH, batch=1)
    folder = kc.export(per_layer, tmp_path / "onnx", "onnx")
    state = read_manifest(folder)["state"]
    keys = [s["shape"] for s in state if s["name"].rsplit(".", 1)[-1] == "keys"]
    assert [shape[2] for shape in keys] == [16, 11]
    runner = kc.load(folder)
    assert torch.equal(runner.generate(ids, 60), kc.generate(per_layer, ids, 60))
