"""Saved scorer folders whose files hash correctly but do not describe the model: tensors of
layers it does not have, integer tensors for floating-point parameters, and a ``scorer.json``
whose config or shapes ``saved_config`` would refuse. Loading refuses each, naming it, and
loads nothing."""

from __future__ import annotations

import json

import pytest
import torch
from test_scorer_io import rewrite_tensors, scorers, transformed

import kvpop_compile as kc
from kvpop_compile import scorer_io


def parameters(model) -> list[dict[str, torch.Tensor]]:
    return [{k: v.clone() for k, v in s.state_dict().items()} for s in scorers(model)]


def assert_unchanged(model, before) -> None:
    for layer, saved in zip(parameters(model), before, strict=True):
        assert all(torch.equal(layer[k], saved[k]) for k in saved)


def refusal_leaving_the_model_unchanged(folder, match: str | None = None) -> str:
    """``load_scorer``'s message for ``folder`` into a fresh model, which it must refuse before
    changing any of the model's parameters."""
    fresh = transformed()
    before = parameters(fresh)
    with pytest.raises(ValueError, match=match) as refused:
        kc.load_scorer(fresh, folder)
    assert_unchanged(fresh, before)
    return str(refused.value)


@pytest.fixture
def folder(tmp_path):
    """A scorer saved from a two-layer model with trained-looking (non-initial) parameters."""
    model = transformed()
    with torch.no_grad():
        for parameter in (p for s in scorers(model) for p in s.parameters()):
            parameter.add_(torch.randn_like(parameter))
    kc.save_scorer(model, tmp_path / "scorer")
    return tmp_path / "scorer"


def test_tensors_of_layers_the_model_lacks_are_refused_naming_them(folder):
    def third_layer(tensors):
        extra = {k.replace("layers.1.", "layers.2."): v.clone() for k, v in tensors.items()
                 if k.startswith("layers.1.")}  # fmt: skip
        return {**tensors, **extra, "scale": torch.ones(1)}

    rewrite_tensors(folder, third_layer)
    message = refusal_leaving_the_model_unchanged(folder, "holds tensors of no layer: ")
    assert "layers.2.b_gates, layers.2.readout.b1, " in message and "scale" in message
    assert message.endswith("scorer.json allows layers.<i>.<name> with i < 2 (its layers)")


def test_load_layers_refuses_tensors_no_scorer_takes(folder):
    tensors = scorer_io.read_tensors(folder)
    fresh = transformed()
    before = parameters(fresh)
    extra = r"layers\.1\.b_gates, layers\.1\.readout\.b1, .* belong to none of them"
    with pytest.raises(ValueError, match=f"the model has 1 layers, the saved tensors {extra}"):
        scorer_io.load_layers(scorers(fresh)[:1], tensors)
    assert_unchanged(fresh, before)
    scorer_io.load_layers(scorers(fresh), tensors)
    for layer, scorer in enumerate(scorers(fresh)):
        for name, value in scorer.state_dict().items():
            assert torch.equal(value, tensors[f"layers.{layer}.{name}"])


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool])
def test_an_integer_tensor_for_a_float_parameter_is_refused(folder, dtype):
    def integers(tensors):
        tensors["layers.1.w_gates"] = tensors["layers.1.w_gates"].round().to(dtype)
        return tensors

    rewrite_tensors(folder, integers)
    # Layer 0 is fine, and is not loaded either.
    assert refusal_leaving_the_model_unchanged(folder) == (
        f"scorer mismatch in layer 1: w_gates is {dtype}, the model's w_gates is torch.float32: "
        "a floating-point tensor is needed"
    )


def test_a_float_tensor_of_another_precision_loads_as_its_values(folder):
    def half(tensors):
        tensors["layers.0.w_key"] = tensors["layers.0.w_key"].to(torch.float16)
        return tensors

    rewrite_tensors(folder, half)
    fresh = transformed()
    kc.load_scorer(fresh, folder)
    saved = scorer_io.read_tensors(folder)["layers.0.w_key"]
    assert saved.dtype == torch.float16
    assert torch.equal(scorers(fresh)[0].w_key, saved.float())


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["kvpop_config"].update(window=4.0),
         "holds an invalid kvpop_config: window must be an integer >= 1, got 4.0"),
        (lambda d: d["kvpop_config"].update(memory_dim=32.0),
         "holds an invalid kvpop_config: memory_dim must be an integer >= 1, got 32.0"),
        (lambda d: d["kvpop_config"].update(windows=4),
         "holds an invalid kvpop_config: .*unexpected keyword argument 'windows'"),
        (lambda d: d["kvpop_config"].update(topk=-1),
         "holds an invalid kvpop_config: topk must be an integer >= 0, got -1"),
    ],
)  # fmt: skip
def test_a_scorer_json_saved_config_refuses_does_not_load(folder, change, message):
    description = json.loads((folder / "scorer.json").read_text())
    change(description)
    (folder / "scorer.json").write_text(json.dumps(description))
    with pytest.raises(ValueError, match=message) as from_config:
        scorer_io.saved_config(folder)
    fresh = transformed()
    before = parameters(fresh)
    for read in (lambda: kc.load_scorer(fresh, folder), lambda: scorer_io.read_tensors(folder),
                 lambda: scorer_io.tensors_sha256(folder)):  # fmt: skip
        with pytest.raises(ValueError) as refused:
            read()
        assert str(refused.value) == str(from_config.value)
    assert_unchanged(fresh, before)


@pytest.mark.parametrize(
    ("field", "value"), [("num_layers", 2.0), ("head_dim", "16"), ("num_kv_heads", 0)]
)
def test_a_scorer_json_with_a_shape_that_is_not_a_count_does_not_load(folder, field, value):
    description = json.loads((folder / "scorer.json").read_text())
    description[field] = value
    (folder / "scorer.json").write_text(json.dumps(description))
    assert refusal_leaving_the_model_unchanged(folder) == (
        f"{folder / 'scorer.json'}: {field} must be an integer >= 1, got {value!r}"
    )
