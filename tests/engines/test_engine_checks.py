"""Engines at batch > 1 decode like the eager model whatever the layout of the token ids they
are given, and ``load`` and the runner refuse what would run wrongly: manifests that are not
engine manifests, state the engine was not compiled for, engine files of another export, and
token ids outside the vocabulary."""

import json
import shutil

import pytest
import torch
from tiny_models import prompt, tiny_qwen3

import kvpop_compile as kc
from kvpop_compile.atomic import sha256
from kvpop_compile.engines.manifest import MANIFEST_VERSION, manifest_sha256
from kvpop_compile.fingerprints import weights_sha256

# Capacity 24 (sinks + window + topk); the prompts exceed it, so tokens are evicted.
WINDOW = kc.KVpopConfig(sinks=2, window=6, topk=16, scorer="window")
MEMORY = kc.KVpopConfig(sinks=2, window=6, topk=16, scorer="memory")
PREFILL_LENGTH = 4
# With a prefill step: two chunks that are slices of the prompt, then decode steps on its last
# two columns.
PROMPT_LENGTH = 2 * PREFILL_LENGTH + 2
NEW_TOKENS = 30
VOCAB = 256  # tiny_qwen3's


@pytest.fixture(scope="module")
def models():
    return {
        "window": kc.transform(tiny_qwen3(), WINDOW),
        "memory": kc.transform(tiny_qwen3(), MEMORY),
        "memory, other weights": kc.transform(tiny_qwen3(seed=1), MEMORY),
    }


@pytest.fixture(scope="module")
def engines(models, tmp_path_factory):
    """AOTInductor engines at batch 2 (window scorer, with a prefill step) and 3 (memory scorer:
    prompts run through its decode step); ONNX engines at batch 3 of two models that differ
    only in their weights."""
    root = tmp_path_factory.mktemp("engines")
    return {
        ("aoti", 2): kc.export(
            models["window"], root / "aoti2", "aoti", batch=2, prefill_length=PREFILL_LENGTH
        ),
        ("aoti", 3): kc.export(models["memory"], root / "aoti3", "aoti", batch=3),
        ("onnx", 3): kc.export(models["memory"], root / "onnx3", "onnx", batch=3),
        ("onnx", 3, "other weights"): kc.export(
            models["memory, other weights"], root / "onnx3b", "onnx", batch=3
        ),
    }


@pytest.fixture(scope="module")
def runners(engines):
    return {key: kc.load(engines[key]) for key in [("aoti", 2), ("aoti", 3), ("onnx", 3)]}


AOTI = [
    pytest.param("window", 2, id="window-batch2"),
    pytest.param("memory", 3, id="memory-batch3"),
]


def layouts(ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """``ids (B, N)`` in other strides, the same values: a slice of a wider tensor (strides
    ``(2N, 1)``) and a transposed copy (column-major, strides ``(1, B)``)."""
    views = {
        "row-major": ids,
        "slice": torch.cat([ids, ids.flip(1)], dim=1)[:, : ids.shape[1]],
        "column-major": ids.t().contiguous().t(),
    }
    assert len({view.stride() for view in views.values()}) == len(views)
    return views


@pytest.mark.parametrize(("scorer", "batch"), AOTI)
def test_aoti_engine_above_batch_one_prefills_and_generates_as_eager(
    models, runners, scorer, batch
):
    model, runner = models[scorer], runners[("aoti", batch)]
    ids = prompt(seed=batch, batch=batch, length=PROMPT_LENGTH)
    with torch.no_grad():
        logits = kc.prefill(model, ids, kc.new_cache(model))
    tokens = kc.generate(model, ids, NEW_TOKENS, eos_token_id=None)
    assert len(set(map(tuple, tokens[:, PROMPT_LENGTH:].tolist()))) == batch  # rows differ
    for layout, view in layouts(ids).items():
        torch.testing.assert_close(runner.prefill(view), logits, msg=layout)
        assert torch.equal(runner.generate(view, NEW_TOKENS), tokens), layout


@pytest.mark.parametrize(("scorer", "batch"), AOTI)
def test_aoti_engine_above_batch_one_generates_left_padded_rows_as_eager(
    models, runners, scorer, batch
):
    model, runner = models[scorer], runners[("aoti", batch)]
    ids = prompt(seed=10 + batch, batch=batch, length=PROMPT_LENGTH)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # row 0 is three tokens shorter; later rows are full
    expected = kc.generate(model, ids, NEW_TOKENS, attention_mask=mask, eos_token_id=None)
    for layout, view in layouts(ids).items():
        assert torch.equal(runner.generate(view, NEW_TOKENS, attention_mask=mask), expected), layout


def test_aoti_decode_takes_a_token_column_sliced_from_a_wider_tensor(models, runners):
    model, runner = models["memory"], runners[("aoti", 3)]
    ids = prompt(seed=3, batch=3, length=PROMPT_LENGTH + 1)
    cache = kc.new_cache(model)
    with torch.no_grad():
        kc.prefill(model, ids[:, :-1], cache)
        expected = kc.decode_one_token(model, ids[:, -1:], None, cache)
    runner.prefill(ids[:, :-1])
    column = ids[:, -1:]  # strides (N, 1); the step was exported at (1, 1)
    assert column.stride() == (PROMPT_LENGTH + 1, 1)
    torch.testing.assert_close(runner.decode(column), expected)


def rewrite_manifest(folder, change):
    """Apply ``change`` to the folder's manifest and record the files' and the manifest's
    hashes anew, as anyone can: the unkeyed hashes then pass."""
    path = folder / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["files"] = {name: sha256(folder / name) for name in manifest["files"]}
    change(manifest)
    manifest["manifest_sha256"] = manifest_sha256(manifest)
    path.write_text(json.dumps(manifest))


def copy_of(engines, key, tmp_path, name="engine"):
    folder = tmp_path / name
    shutil.copytree(engines[key], folder)
    return folder


def test_load_refuses_a_manifest_that_is_not_a_json_object(engines, tmp_path):
    folder = copy_of(engines, ("onnx", 3), tmp_path)
    for text, kind in [("[]", "an array"), ('"decode"', "a string"), ("7", "a number")]:
        (folder / "manifest.json").write_text(text)
        with pytest.raises(
            ValueError, match=rf"engine/manifest.json must hold a JSON object .*got {kind}"
        ):
            kc.load(folder)


def test_load_refuses_a_manifest_that_lacks_a_field_or_has_one_of_another_type(engines, tmp_path):
    cases = [
        (lambda m: m.pop("state"), "lacks the field 'state'"),
        (lambda m: m.pop("model"), "lacks the field 'model'"),
        (lambda m: m.update(batch="3"), "field 'batch' must be a number, got a string '3'"),
        (lambda m: m.update(batch=True), "field 'batch' must be a number, got a boolean True"),
        (lambda m: m.update(files=[]), "field 'files' must be an object, got an array"),
        (lambda m: m["state"][0].pop("dtype"), r"lacks the field 'state\[0\].dtype'"),
        (
            lambda m: m["state"][1].update(shape=[3, 2, -24, 16]),
            r"state\[1\].shape must be a list of sizes >= 0, got \[3, 2, -24, 16\]",
        ),
        (
            lambda m: m["state"][2].update(dtype="int8"),
            r"state\[2\].dtype must be one of float32, float16, bfloat16, int64, got 'int8'",
        ),
        (lambda m: m.update(steps=["prefill"]), "steps must be decode and optionally prefill"),
        (lambda m: m["model"].pop("vocab_size"), "model.vocab_size must be a number"),
    ]
    for i, (change, message) in enumerate(cases):
        folder = copy_of(engines, ("onnx", 3), tmp_path, f"engine{i}")
        rewrite_manifest(folder, change)
        with pytest.raises(ValueError, match=message):
            kc.load(folder)


def test_load_refuses_an_engine_of_an_earlier_manifest_version_by_name(engines, tmp_path):
    """Versions 2 and 3 recorded the weights' SHA-256 in another form than
    ``kvpop_compile.fingerprints.weights_sha256``: no model could be checked against them, so
    they are refused by version, with what to do, before anything else is read."""
    assert MANIFEST_VERSION == 4
    for version in (3, 2):
        folder = copy_of(engines, ("onnx", 3), tmp_path, f"v{version}")
        rewrite_manifest(folder, lambda m, v=version: m.update(manifest_version=v))
        with pytest.raises(
            ValueError,
            match=rf"manifest.json has manifest version {version}, whose weights_sha256 was "
            r"computed another way than this kvpop_compile's \(manifest version 4\).*re-export "
            "the model",
        ):
            kc.load(folder)
    folder = copy_of(engines, ("onnx", 3), tmp_path, "v5")
    rewrite_manifest(folder, lambda m: m.update(manifest_version=5))
    with pytest.raises(
        ValueError, match="has manifest version 5; this kvpop_compile reads version 4: re-export"
    ):
        kc.load(folder)


def test_load_refuses_state_the_aoti_engine_was_not_compiled_for(engines, tmp_path):
    """A cache smaller than the package was compiled for would be written past its end."""
    keys = [2, 2, WINDOW.capacity, 16]  # (batch, kv heads, slots, head_dim)

    def understate(manifest):
        spec = next(s for s in manifest["state"] if s["name"] == "layers.0.keys")
        assert spec["shape"] == keys
        spec["shape"] = [2, 2, WINDOW.capacity // 2, 16]

    folder = copy_of(engines, ("aoti", 2), tmp_path, "understated")
    rewrite_manifest(folder, understate)
    with pytest.raises(
        ValueError,
        match=r"decode.pt2 takes layers.0.keys as float32 \(2, 2, 24, 16\) strides "
        r"\(768, 384, 16, 1\), the manifest states float32 \(2, 2, 12, 16\)",
    ):
        kc.load(folder)
    folder = copy_of(engines, ("aoti", 2), tmp_path, "one_fewer")
    rewrite_manifest(folder, lambda m: m["state"].pop())
    with pytest.raises(ValueError, match="decode.pt2 takes 19 inputs, the manifest describes 18"):
        kc.load(folder)


def test_load_refuses_state_dtypes_the_onnx_engine_does_not_take(engines, tmp_path):
    def retype(manifest):
        spec = next(s for s in manifest["state"] if s["name"] == "layers.1.seen")
        assert spec["dtype"] == "int64"
        spec["dtype"] = "float32"

    folder = copy_of(engines, ("onnx", 3), tmp_path)
    rewrite_manifest(folder, retype)
    with pytest.raises(
        ValueError,
        match=r"decode.onnx takes layers.1.seen as int64 \(3,\), the manifest states float32",
    ):
        kc.load(folder)


def test_load_refuses_an_engine_file_of_another_model(models, engines, tmp_path):
    """Another model's decode.onnx copied in, with the manifest's hashes recomputed: the file
    records the weights it was exported from."""
    folder = copy_of(engines, ("onnx", 3), tmp_path)
    shutil.copy(engines[("onnx", 3, "other weights")] / "decode.onnx", folder / "decode.onnx")
    rewrite_manifest(folder, lambda m: None)
    with pytest.raises(ValueError, match="decode.onnx was exported from other weights"):
        kc.load(folder, model=models["memory"])
    with pytest.raises(ValueError, match="decode.onnx was exported from other weights"):
        kc.load(folder)
    kc.load(engines[("onnx", 3)], model=models["memory"])  # the intact folder loads


def test_load_refuses_an_aoti_manifest_that_claims_other_weights(models, engines, tmp_path):
    other = kc.transform(tiny_qwen3(seed=1), WINDOW)  # same architecture and config
    folder = copy_of(engines, ("aoti", 2), tmp_path)
    rewrite_manifest(folder, lambda m: m.update(weights_sha256=weights_sha256(other)))
    with pytest.raises(ValueError, match="decode.pt2 was exported from other weights"):
        kc.load(folder, model=other)


def test_load_refuses_aoti_step_files_swapped_with_each_other(engines, tmp_path):
    folder = copy_of(engines, ("aoti", 2), tmp_path)
    (folder / "decode.pt2").rename(folder / "swap")
    (folder / "prefill.pt2").rename(folder / "decode.pt2")
    (folder / "swap").rename(folder / "prefill.pt2")
    rewrite_manifest(folder, lambda m: None)
    with pytest.raises(ValueError, match="decode.pt2 holds the 'prefill' step"):
        kc.load(folder)


def test_load_binds_the_engine_to_the_kvpop_config(models, engines, tmp_path):
    """The window scorer has no parameters: a model transformed with another budget has the
    same weights, and must still be refused."""
    wider = kc.KVpopConfig(sinks=2, window=8, topk=14, scorer="window")  # the same capacity
    rebudgeted = kc.transform(tiny_qwen3(), wider)
    assert weights_sha256(rebudgeted) == weights_sha256(models["window"])
    with pytest.raises(
        ValueError,
        match="engine mismatch: exported with window=6, this model is transformed with window=8",
    ):
        kc.load(engines[("aoti", 2)], model=rebudgeted)
    folder = copy_of(engines, ("aoti", 2), tmp_path)
    rewrite_manifest(folder, lambda m: m["kvpop_config"].update(window=8, topk=14))
    with pytest.raises(
        ValueError, match="decode.pt2 was exported with topk=16, the manifest states topk=14"
    ):
        kc.load(folder, config=wider)


@pytest.mark.parametrize("key", [("aoti", 2), ("onnx", 3)], ids=["aoti", "onnx"])
def test_runner_refuses_token_ids_outside_the_vocabulary(engines, key):
    runner = kc.load(engines[key])
    batch = runner.batch
    calls = []
    runner.steps = {name: lambda inputs, name=name: calls.append(name) for name in runner.steps}
    ids = prompt(batch=batch, length=PROMPT_LENGTH)
    outside = "is outside this engine's vocabulary: ids must be in \\[0, 256\\)"
    for bad in (-1, VOCAB, 10 * VOCAB, -VOCAB):
        wrong = ids.clone()
        wrong[batch - 1, 5] = bad
        with pytest.raises(ValueError, match=f"token id {bad} {outside}"):
            runner.generate(wrong, 3)
        with pytest.raises(ValueError, match=f"token id {bad} {outside}"):
            runner.prefill(wrong.to(torch.int32))
        with pytest.raises(ValueError, match=f"token id {bad} {outside}"):
            runner.decode(wrong[:, 5:6])
    assert calls == []


@pytest.mark.parametrize("key", [("aoti", 3), ("onnx", 3)], ids=["aoti", "onnx"])
def test_runner_decodes_the_first_and_last_token_ids_as_eager(models, runners, key):
    model, runner = models["memory"], runners[key]
    ids = prompt(seed=5, batch=3, length=PROMPT_LENGTH)
    token = torch.tensor([[0], [VOCAB - 1], [17]])
    cache = kc.new_cache(model)
    with torch.no_grad():
        kc.prefill(model, ids, cache)
        expected = kc.decode_one_token(model, token, None, cache)
    runner.prefill(ids)
    torch.testing.assert_close(runner.decode(token), expected)
