"""save_scorer / load_scorer round trip and refusals."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from tiny_models import prompt, tiny_qwen3

import kvpop_compile as kc
from kvpop_compile import scorer_io
from kvpop_compile.evaluation.methods import EMBEDDED_SCORERS

CONFIG = kc.KVpopConfig(sinks=2, window=4, topk=6, scorer="memory")


def transformed(config=CONFIG, **overrides):
    return kc.transform(tiny_qwen3(**overrides), config)


def scorers(model):
    return [layer.self_attn.scorer for layer in model.model.layers]


def test_round_trip_restores_parameters_and_outputs(tmp_path):
    trained = transformed()
    with torch.no_grad():
        for scorer in scorers(trained):
            for parameter in scorer.parameters():
                parameter.add_(torch.randn_like(parameter))
    kc.save_scorer(trained, tmp_path / "scorer")
    saved = json.loads((tmp_path / "scorer" / "scorer.json").read_text())
    assert saved["kvpop_config"]["scorer"] == "memory" and saved["num_layers"] == 2

    fresh = transformed()
    assert not torch.equal(scorers(fresh)[0].w_key, scorers(trained)[0].w_key)
    kc.load_scorer(fresh, tmp_path / "scorer")
    for a, b in zip(scorers(fresh), scorers(trained), strict=True):
        for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
            assert torch.equal(x, y), name
    ids = prompt(length=30)
    assert torch.equal(kc.generate(fresh, ids, 10), kc.generate(trained, ids, 10))


@pytest.mark.parametrize(
    ("model_kwargs", "message"),
    [
        ({"config": kc.KVpopConfig(sinks=2, window=4, topk=6, scorer="mlp")}, "scorer='memory'"),
        ({"config": kc.KVpopConfig(sinks=2, window=8, topk=6)}, "window=4"),
        ({"config": kc.KVpopConfig(sinks=2, window=4, topk=6, memory_dim=8)}, "memory_dim=32"),
        ({"num_key_value_heads": 4}, "num_kv_heads=2, the model has 4"),
        ({"num_hidden_layers": 3}, "num_layers=2, the model has 3"),
    ],
)
def test_mismatched_scorer_is_refused_naming_the_mismatch(tmp_path, model_kwargs, message):
    kc.save_scorer(transformed(), tmp_path)
    config = model_kwargs.pop("config", CONFIG)
    with pytest.raises(ValueError, match=f"scorer mismatch: .*{message}"):
        kc.load_scorer(transformed(config, **model_kwargs), tmp_path)


def test_budget_fields_that_do_not_shape_the_scorer_may_differ(tmp_path):
    kc.save_scorer(transformed(), tmp_path)
    kc.load_scorer(transformed(kc.KVpopConfig(sinks=4, window=4, topk=20)), tmp_path)


def test_missing_or_corrupt_files_are_refused(tmp_path):
    model = transformed()
    with pytest.raises(FileNotFoundError, match="scorer.json not found"):
        kc.load_scorer(model, tmp_path)
    kc.save_scorer(model, tmp_path)
    (tmp_path / "scorer.json").write_text("{not json")
    with pytest.raises(ValueError, match="is not valid JSON"):
        kc.load_scorer(model, tmp_path)
    (tmp_path / "scorer.json").write_text(json.dumps(["not", "a", "dict"]))
    with pytest.raises(ValueError, match=r"is not a kvpop-scorer file \(no kvpop_config\)"):
        kc.load_scorer(model, tmp_path)
    (tmp_path / "scorer.json").write_text(json.dumps({"format": "other", "kvpop_config": {}}))
    with pytest.raises(ValueError, match="is not a kvpop-scorer v2 file"):
        kc.load_scorer(model, tmp_path)
    with pytest.raises(ValueError, match="is not transformed"):
        kc.save_scorer(tiny_qwen3(), tmp_path / "never")
    assert not (tmp_path / "never").exists()


def test_random_scorer_seed_must_match(tmp_path):
    kc.save_scorer(
        transformed(kc.KVpopConfig(sinks=2, window=4, topk=6, scorer="random")), tmp_path
    )
    with pytest.raises(ValueError, match="scorer mismatch: saved with seed=0, .* seed=1"):
        other = kc.KVpopConfig(sinks=2, window=4, topk=6, scorer="random", seed=1)
        kc.load_scorer(transformed(other), tmp_path)


def test_a_failed_save_leaves_the_previous_scorer_intact(tmp_path, monkeypatch):
    model = transformed()
    kc.save_scorer(model, tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def failing_save(tensors, filename):
        with open(filename, "wb") as handle:
            handle.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(scorer_io, "save_file", failing_save)
    with pytest.raises(OSError, match="disk full"):
        kc.save_scorer(model, tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    kc.load_scorer(transformed(), tmp_path)


def rewrite_tensors(folder: Path, change) -> None:
    """Replace the saved tensors by ``change(tensors)`` and record the new file's SHA-256, as a
    valid save of those tensors would."""
    tensors = scorer_io.load_file(folder / "scorer.safetensors")
    save_file(change(tensors), folder / "scorer.safetensors")
    description = json.loads((folder / "scorer.json").read_text())
    description["tensors_sha256"] = scorer_io.sha256(folder / "scorer.safetensors")
    (folder / "scorer.json").write_text(json.dumps(description))


def test_corrupted_or_truncated_tensors_are_refused_naming_the_file(tmp_path):
    model = transformed()
    kc.save_scorer(model, tmp_path)
    tensors_file = tmp_path / "scorer.safetensors"
    original = tensors_file.read_bytes()
    # The last 400 bytes hold parameters: overwritten, they parse as other (NaN) numbers.
    tensors_file.write_bytes(original[:-400] + b"\xff" * 400)
    with pytest.raises(ValueError, match=f"{tensors_file} is corrupted, truncated .*SHA-256"):
        kc.load_scorer(model, tmp_path)
    tensors_file.write_bytes(original[:100])
    with pytest.raises(ValueError, match=f"{tensors_file} is corrupted, truncated"):
        kc.load_scorer(model, tmp_path)
    # Even with a matching hash, a file safetensors cannot parse is reported with its path.
    description = json.loads((tmp_path / "scorer.json").read_text())
    description["tensors_sha256"] = scorer_io.sha256(tensors_file)
    (tmp_path / "scorer.json").write_text(json.dumps(description))
    with pytest.raises(ValueError, match=f"{tensors_file} is not a readable safetensors file"):
        kc.load_scorer(model, tmp_path)
    tensors_file.write_bytes(original)
    with pytest.raises(ValueError, match="is corrupted, truncated"):
        kc.load_scorer(model, tmp_path)  # the recorded hash is the truncated file's now


def test_non_finite_parameters_are_refused_at_save_and_load(tmp_path):
    model = transformed()
    kc.save_scorer(model, tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with torch.no_grad():
        scorers(model)[1].w_key[0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"layers\.1\.w_key has 1 non-finite value"):
        kc.save_scorer(model, tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before

    def poison(tensors):
        tensors["layers.0.w_key"][0, 0, :3] = float("inf")
        return tensors

    rewrite_tensors(tmp_path, poison)
    fresh = transformed()
    kept = scorers(fresh)[0].w_key.clone()
    with pytest.raises(ValueError, match=r"layers\.0\.w_key has 3 non-finite value\(s\)"):
        kc.load_scorer(fresh, tmp_path)
    assert torch.equal(scorers(fresh)[0].w_key, kept)  # nothing was loaded


def test_saved_folders_record_the_tensors_sha256(tmp_path):
    kc.save_scorer(transformed(), tmp_path)
    saved = json.loads((tmp_path / "scorer.json").read_text())
    assert saved["format_version"] == 2
    assert saved["tensors_sha256"] == scorer_io.sha256(tmp_path / "scorer.safetensors")
    del saved["tensors_sha256"]
    (tmp_path / "scorer.json").write_text(json.dumps(saved))
    with pytest.raises(ValueError, match="has no valid tensors_sha256"):
        kc.load_scorer(transformed(), tmp_path)
    saved["format_version"] = 1
    (tmp_path / "scorer.json").write_text(json.dumps(saved))
    with pytest.raises(ValueError, match="is a kvpop-scorer v1 file, which records no SHA-256"):
        kc.load_scorer(transformed(), tmp_path)


@pytest.mark.parametrize("folder", sorted(EMBEDDED_SCORERS.iterdir()), ids=lambda f: f.name)
def test_shipped_scorers_are_verified(folder):
    tensors = scorer_io.read_tensors(folder)
    assert tensors and all(torch.isfinite(t).all() for t in tensors.values())
