"""Per-layer budgets: each layer keeps its own window and pool, exactly as a model of one budget
keeps that layer's; configs, caches and saved scorers carry them, and misuse is refused."""

import dataclasses
import inspect

import pytest
import torch
from tiny_models import prompt, tiny_qwen3

import kvpop_compile as kc
from kvpop_compile.scorer_io import saved_config
from kvpop_compile.training.distributed import ProcessGroup
from kvpop_compile.training.objectives import DistillObjective, ScorerObjective
from kvpop_compile.training.settings import TrainSettings

SINKS = 2
LAYERS = ((3, 6), (5, 2))  # (window, topk) of layers 0 and 1: capacities 11 and 9
TEXT = inspect.getsource(dataclasses)  # real text to train on


def _config(scorer: str = "memory", **fields) -> kc.KVpopConfig:
    settings = {"sinks": SINKS, "window": [w for w, _ in LAYERS],
                "topk": [k for _, k in LAYERS], "scorer": scorer, "memory_dim": 8,
                "memory_value_dim": 8, "scorer_hidden": 16, "lam": 0.01, **fields}  # fmt: skip
    return kc.KVpopConfig(**settings)


def _randomise(model, seed: int):
    torch.manual_seed(seed)
    with torch.no_grad():  # trained-looking scorers: every parameter random and nonzero
        for layer in model.model.layers:
            for parameter in layer.self_attn.scorer.parameters():
                parameter.normal_()
    return model


def _run(model, ids: torch.Tensor, decode_steps: int, cache=None, chunk: int | None = None):
    """Cached positions per layer ``(B, H, C)`` and the last logits after a prefill of ``ids``
    less its last ``decode_steps`` tokens (one forward, or ``kc.prefill`` in chunks of
    ``chunk`` tokens), then those tokens one at a time."""
    prefill = ids.shape[1] - decode_steps
    with torch.no_grad():
        if chunk is not None:
            cache = kc.new_cache(model)
            logits = kc.prefill(model, ids[:, :prefill], cache, chunk=chunk)
        else:
            kwargs = {} if cache is None else {"past_key_values": cache}
            out = model(ids[:, :prefill], use_cache=True, **kwargs)
            cache, logits = out.past_key_values, out.logits[:, -1]
        for step in range(prefill, ids.shape[1]):
            out = model(ids[:, step : step + 1], past_key_values=cache, use_cache=True)
            logits = out.logits[:, -1]
    return [layer.state.positions.clone() for layer in cache.layers], logits


def _reference(config: kc.KVpopConfig, seed: int):
    """The oracle: each layer's attention taken from a model transformed with that layer's budget
    alone (the code path of one budget), joined in one model, and a cache whose layers are made
    for those budgets."""
    models = [_randomise(kc.transform(tiny_qwen3(), config.layer(i)), seed)
              for i in range(len(LAYERS))]  # fmt: skip
    joined = models[-1]
    for i, model in enumerate(models[:-1]):
        joined.model.layers[i].self_attn = model.model.layers[i].self_attn
    cache = kc.KVpopCache(len(LAYERS), config.layer(len(LAYERS) - 1))
    for i, layer in enumerate(cache.layers):
        layer.config = joined.model.layers[i].self_attn.kvpop_config
    return joined, cache


@pytest.mark.parametrize("scorer", ["memory", "mlp", "h2o"])
@pytest.mark.parametrize("decode_steps", [0, 9])
@pytest.mark.parametrize("fields", [{}, {"priority_span": 3, "prefill_chunk": 5}],
                         ids=["whole", "spread-chunked"])  # fmt: skip
def test_each_layer_keeps_what_a_model_of_its_budget_alone_keeps(scorer, decode_steps, fields):
    if scorer == "h2o":
        fields = {key: value for key, value in fields.items() if key != "priority_span"}
    config = _config(scorer, **fields)
    ids = prompt(seed=7, batch=2, length=40)
    model = _randomise(kc.transform(tiny_qwen3(), config), seed=4)
    # Chunked: the model under test prefills in chunks of 5 (fewer than either layer's
    # capacity) or of its largest layer's capacity (more than layer 1's); the reference in
    # one forward, which the chunked rule continues exactly.
    chunk = config.prefill_chunk
    positions, logits = _run(model, ids, decode_steps, chunk=chunk)
    runs = [(positions, logits)]
    if chunk is not None:
        runs.append(_run(model, ids, decode_steps, chunk=config.max_capacity))
    reference, cache = _reference(config, seed=4)
    want_positions, want_logits = _run(reference, ids, decode_steps, cache)
    assert [p.shape[-1] for p in positions] == [SINKS + w + k for w, k in LAYERS]
    for got_positions, got_logits in runs:
        for got, want in zip(got_positions, want_positions, strict=True):
            if chunk is None:  # the same forwards: the same slots
                assert torch.equal(got, want)
            else:  # chunks fill the pool's slots in another order (design.md §5)
                assert torch.equal(got.sort(-1).values, want.sort(-1).values)
        tolerance = 0 if chunk is None else 1e-5
        torch.testing.assert_close(got_logits, want_logits, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("decode_steps", [0, 6])
def test_the_window_policy_keeps_the_sinks_and_each_layers_newest_tokens(decode_steps):
    ids = prompt(seed=2, batch=1, length=30)
    model = kc.transform(tiny_qwen3(), _config("window", lam=0.0))
    positions, _ = _run(model, ids, decode_steps)
    for layer_positions, (window, topk) in zip(positions, LAYERS, strict=True):
        newest = set(range(ids.shape[1] - window - topk, ids.shape[1]))
        for head in layer_positions[0]:
            assert set(head.tolist()) == set(range(SINKS)) | newest


def test_a_per_layer_budget_of_equal_layers_is_the_budget_of_one():
    ids = prompt(seed=3, batch=2, length=33)
    one = kc.KVpopConfig(sinks=SINKS, window=4, topk=5, memory_dim=8, memory_value_dim=8,
                         scorer_hidden=16, lam=0.01)  # fmt: skip
    listed = dataclasses.replace(one, window=(4, 4), topk=(5, 5))
    got = _run(_randomise(kc.transform(tiny_qwen3(), listed), 1), ids, 5)
    want = _run(_randomise(kc.transform(tiny_qwen3(), one), 1), ids, 5)
    assert all(torch.equal(g, w) for g, w in zip(got[0], want[0], strict=True))
    torch.testing.assert_close(got[1], want[1], rtol=0, atol=0)


def test_the_config_lists_each_layers_budget():
    config = _config()
    assert config.per_layer == 2
    assert config.window == (3, 5) and config.topk == (6, 2)
    assert config.capacities == (11, 9) and config.max_capacity == 11
    assert config.chunk_length == 11
    assert config.layer(1).window == 5 and config.layer(1).topk == 2
    assert config.layer(1).per_layer is None and config.layer(1) is config.layer(1)
    assert kc.KVpopConfig(**config.to_dict()) == config
    assert config.to_dict()["window"] == [3, 5]
    broadcast = kc.KVpopConfig(window=7, topk=(1, 2, 3))
    assert broadcast.window == (7, 7, 7) and broadcast.capacities == (12, 13, 14)
    one = kc.KVpopConfig(window=7, topk=1)
    assert one.per_layer is None and one.layer(5) is one and one.capacities == (12,)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"window": [3, 5], "topk": [1, 2, 3]}, "one window and one topk per layer"),
        ({"window": [], "topk": 4}, "one window and one topk per layer"),
        ({"window": [3, 0], "topk": 4}, r"window\[1\] must be an integer >= 1, got 0"),
        ({"window": 3, "topk": [4, -1]}, r"topk\[1\] must be an integer >= 0, got -1"),
        ({"window": [3, 2.5], "topk": 4}, r"window\[1\] must be an integer >= 1, got 2.5"),
        ({"window": [3, True], "topk": 4}, r"window\[1\] must be an integer >= 1, got True"),
    ],
)
def test_bad_per_layer_budgets_are_refused_by_name(fields, message):
    with pytest.raises(ValueError, match=message):
        kc.KVpopConfig(**fields)


def test_a_per_layer_budget_has_no_one_capacity_and_names_its_layers():
    config = _config()
    with pytest.raises(ValueError, match=r"keeps \[11, 9\] slots per KV head"):
        _ = config.capacity
    with pytest.raises(ValueError, match="from 0 to 1.*got 2"):
        config.layer(2)


def test_a_model_of_another_number_of_layers_is_refused():
    config = dataclasses.replace(_config(), window=(3, 5, 5), topk=(6, 2, 2))
    with pytest.raises(ValueError, match="lists 3 layers.*the model has 2"):
        kc.transform(tiny_qwen3(), config)
    with pytest.raises(ValueError, match="lists 3 layers.*the model has 2"):
        kc.KVpopCache(2, config)


def test_a_cache_made_for_another_budget_is_refused():
    model = kc.transform(tiny_qwen3(), _config())
    other = kc.KVpopCache(2, dataclasses.replace(_config(), window=(3, 4), topk=(6, 3)))
    with pytest.raises(ValueError, match="in layer 1; use kvpop_compile.new_cache"):
        model(prompt(), past_key_values=other, use_cache=True)


def test_a_saved_scorer_keeps_its_per_layer_budget(tmp_path):
    model = _randomise(kc.transform(tiny_qwen3(), _config()), seed=2)
    kc.save_scorer(model, tmp_path / "scorer")
    assert saved_config(tmp_path / "scorer") == _config()
    loaded = kc.load_scorer(kc.transform(tiny_qwen3(), _config()), tmp_path / "scorer")
    ids = prompt(seed=9, length=30)
    assert torch.equal(_run(loaded, ids, 3)[1], _run(model, ids, 3)[1])
    one = dataclasses.replace(_config(), window=3, topk=6)
    with pytest.raises(ValueError, match=r"saved with window=\[3, 5\]"):
        kc.load_scorer(kc.transform(tiny_qwen3(), one), tmp_path / "scorer")


def _layer_records(config: kc.KVpopConfig, model, ids: torch.Tensor) -> list:
    """Each layer's (loss, ranking accuracy) of one scorer-training forward at ``config``."""
    with ScorerObjective(model, config, "boundary", tau=2.0, target="max") as objective:
        objective(ids)
        return [teacher.records[0] for teacher in objective.teachers]


def test_scorer_training_holds_each_layer_at_its_own_budget():
    """The oracle: each layer's loss is what training at that layer's budget alone gives the
    layer (the same model and input; scorers are seeded per layer, so they start equal)."""
    config = _config(lam=0.002)
    model, ids = tiny_qwen3(), prompt(seed=3, batch=2, length=48)
    records = _layer_records(config, model, ids)
    # Each layer's one budget written out from LAYERS, not through config.layer.
    alone = [_layer_records(_config(lam=0.002, window=w, topk=k), model, ids) for w, k in LAYERS]
    for i in range(len(LAYERS)):
        assert torch.equal(records[i][0], alone[i][i][0])
        assert torch.equal(records[i][1], alone[i][i][1])
    # The budgets differ enough that the layers' decisions differ: one budget for both would
    # give layer 0 another loss.
    assert not torch.equal(records[0][0], alone[1][0][0])


def test_distillation_masks_each_layer_at_its_own_budget():
    config = _config()
    model = tiny_qwen3()
    objective = DistillObjective(
        model, config, "boundary", 1.0, trainable=None, kl_top=8, kl_weight=1.0,
        group=ProcessGroup.current(),
    )  # fmt: skip
    with objective:
        layers = objective.student.model.layers
        kept = [layer.self_attn.kvpop_student_attention.config for layer in layers]
    assert kept == [config.layer(i) for i in range(len(LAYERS))]


def test_a_scorer_trained_at_a_per_layer_budget_saves_and_runs_it(tmp_path):
    config = _config()
    settings = kc.TrainSettings(steps=2, seq_len=40, batch_size=2, eval_every=2, lr=3e-3)
    report = kc.train_scorer(tiny_qwen3(), [TEXT], config, settings, output_dir=tmp_path,
                             progress=False)  # fmt: skip
    assert saved_config(report.scorer_path) == config
    loaded = kc.load_scorer(kc.transform(tiny_qwen3(), config), report.scorer_path)
    assert _run(loaded, prompt(seed=5, length=30), 2)[0][1].shape[-1] == 9  # layer 1's capacity


def test_training_refuses_sequences_no_longer_than_the_largest_layer():
    with pytest.raises(ValueError, match=r"seq_len 11 must exceed the capacity 11 .*largest"):
        TrainSettings(seq_len=11).check_for(_config(), 1)
    TrainSettings(seq_len=12).check_for(_config(), 1)


def test_the_compiled_decode_step_generates_the_eager_tokens():
    model = _randomise(kc.transform(tiny_qwen3(), _config()), seed=6)
    ids = prompt(seed=4, batch=1, length=20)
    step = kc.compile(model)
    assert torch.equal(kc.generate(model, ids, 16, step=step), kc.generate(model, ids, 16))
