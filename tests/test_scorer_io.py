"""save_scorer / load_scorer round trip and refusals."""

import json

import pytest
import torch
from tiny_models import prompt, tiny_qwen3

import kvpop_compile as kc
from kvpop_compile import scorer_io

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
    with pytest.raises(ValueError, match="is not a kvpop-scorer v1 file"):
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
