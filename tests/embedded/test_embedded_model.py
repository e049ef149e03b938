"""The shipped byte-level Qwen3 and its standard-library corpus split."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3ForCausalLM

from kvpop_compile.embedded import EMBEDDED_MODEL, load_embedded_model
from kvpop_compile.embedded.corpus import (
    decode,
    encode,
    is_held_out,
    list_files,
    read_bytes,
    split_files,
)

# The per-byte entropy of the training corpus's byte frequencies is 3.16 nats: a model that uses
# no context at all cannot beat it on average, and uniform guessing costs log(256) = 5.55.
CONTEXT_FREE_NLL = 3.16


@pytest.fixture(scope="module")
def model():
    return load_embedded_model()


@pytest.fixture(scope="module")
def recorded_split():
    return json.loads((EMBEDDED_MODEL / "split.json").read_text())


def test_checkpoint_loads_with_transformers_and_has_documented_shapes():
    hf = AutoModelForCausalLM.from_pretrained(EMBEDDED_MODEL)
    assert isinstance(hf, Qwen3ForCausalLM)
    c = hf.config
    assert (c.vocab_size, c.hidden_size, c.intermediate_size) == (256, 256, 512)
    assert (c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads) == (4, 4, 2)
    assert c.head_dim == 64 and c.max_position_embeddings >= 2048
    assert c.tie_word_embeddings
    assert sum(p.numel() for p in hf.parameters()) == 2_427_648


def test_loader_returns_eval_model_in_requested_dtype(model):
    assert isinstance(model, Qwen3ForCausalLM) and not model.training
    assert next(model.parameters()).dtype == torch.float32
    half = load_embedded_model(dtype=torch.bfloat16)
    assert next(half.parameters()).dtype == torch.bfloat16


def test_split_is_deterministic_and_disjoint():
    train, held_out = split_files()
    assert (train, held_out) == split_files()
    assert not set(train) & set(held_out)
    assert sorted(train + held_out) == list_files()
    # The rule needs no list: a fixed path lands on a fixed side everywhere.
    path = "collections/__init__.py"
    digest = int(hashlib.sha256(path.encode()).hexdigest(), 16)
    assert is_held_out(path) == (digest % 10 == 0)
    assert 0.05 < len(held_out) / (len(train) + len(held_out)) < 0.15
    assert not any(part in {"test", "tests"} for f in train for part in f.split("/")[:-1])


def test_split_matches_the_recorded_one_for_files_present(recorded_split):
    present = set(list_files())
    held = set(recorded_split["held_out"])
    assert not held & set(recorded_split["train"])
    for name in present & (held | set(recorded_split["train"])):
        assert is_held_out(name) == (name in held), name


def test_held_out_text_is_predicted_far_better_than_without_context(model, recorded_split):
    present = set(list_files())
    names = [f for f in recorded_split["held_out"] if f in present]
    if not names:
        pytest.skip("none of the recorded held-out files is in this Python's standard library")
    data = b"".join(read_bytes(f) for f in names)[:1025]
    ids = encode(data)[None]  # (1, 1025)
    with torch.no_grad():
        logits = model(input_ids=ids[:, :-1]).logits  # (1, 1024, 256)
    nll = torch.nn.functional.cross_entropy(logits[0], ids[0, 1:]).item()
    assert nll < CONTEXT_FREE_NLL - 1.0 < math.log(256)


def test_byte_tokens_round_trip():
    text = "def f(x):\n    return 'π'\n"
    ids = encode(text)
    assert ids.dtype == torch.int64 and int(ids.max()) < 256
    assert decode(ids) == text
    with pytest.raises(ValueError, match="0..255"):
        decode(torch.tensor([0, 256]))


def test_missing_or_corrupt_folder_gives_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_embedded_model(path=tmp_path / "absent")
    (tmp_path / "config.json").write_text((EMBEDDED_MODEL / "config.json").read_text())
    with pytest.raises(FileNotFoundError, match="lacks model.safetensors"):
        load_embedded_model(path=tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"not a checkpoint")
    with pytest.raises(RuntimeError, match="could not be loaded"):
        load_embedded_model(path=tmp_path)


@pytest.mark.parametrize("policy", ["memory", "mlp"])
@pytest.mark.parametrize("budget", ["75%", "88%"])
def test_shipped_scorers_match_the_benchmark_budgets(policy, budget):
    from safetensors.torch import load_file

    from kvpop_compile.evaluation.methods import BUDGETS, budget_config, scorer_folder
    from kvpop_compile.scorer_io import saved_config

    folder = scorer_folder(policy, BUDGETS[budget])
    # the README documents the shipped scorers as trained with priority_span 10, a readout 256
    # wide, and windows of 64 (mlp) and, for memory, saved for 256 of its 512 slots at 75% and
    # 96 of 256 at 88%, on the families model's training recall items; then each folder's
    # window and recency term chosen on validation text and recall (choose_recency.py), then
    # how the four layers share that memory (choose_layer_budgets.py): three keep little and
    # layer 3 the rest; then that per-layer budget chosen again with the recency term, where
    # the mlp scorers moved and the memory ones stayed (docs/experiments.md)
    trained_window = {"mlp": 64, "memory": 256 if budget == "75%" else 96}[policy]
    chosen = {("memory", "75%"): (384, 0.0005), ("memory", "88%"): (192, 0.0005),
              ("mlp", "75%"): (384, 0.0005), ("mlp", "88%"): (192, 0.001)}  # fmt: skip
    first_layers = {("memory", "75%"): ((364, 364, 364, 256), (16, 16, 16, 636)),
                    ("memory", "88%"): ((172, 172, 172, 96), (16, 16, 16, 348)),
                    ("mlp", "75%"): ((364, 364, 364, 384), (16, 16, 16, 508)),
                    ("mlp", "88%"): ((44, 44, 44, 192), (16, 16, 16, 636))}  # fmt: skip
    layers = {**first_layers,
              ("mlp", "75%"): ((364, 364, 364, 256), (16, 16, 16, 636)),
              ("mlp", "88%"): ((108, 108, 108, 96), (16, 16, 16, 540))}  # fmt: skip
    shipped_lam = {"memory": 0.0005, "mlp": 0.0}[policy]
    window, lam = chosen[policy, budget]
    config = budget_config(policy, BUDGETS[budget], priority_span=10, window=window)
    one_budget = dataclasses.replace(config, scorer_hidden=256, lam=lam)
    windows, topks = layers[policy, budget]
    shipped = saved_config(folder)
    assert shipped == dataclasses.replace(one_budget, window=windows, topk=topks, lam=shipped_lam)
    assert sum(shipped.capacities) == 4 * BUDGETS[budget]  # the budget's memory, shared
    record = json.loads((folder / "training.json").read_text())
    assert record["policy"] == policy and record["held_out_ranking"]
    assert record["priority_span"] == 10 and record["capacity"] == BUDGETS[budget]
    assert record["recall_fraction"] == 0.5
    # chosen among candidates on validation recall items, never held-out ones
    assert record["selection"]["split"] == "validation"
    if (policy, budget) == ("memory", "88%"):
        # then trained again at that per-layer budget (train_embedded_scorers.py
        # --layer-windows), and the run's choice kept over the scorer saved before by the same
        # rule and measures; the comparison and the earlier record were added to
        # training.json when the folder was replaced (docs/experiments.md, 2026-12-07). What
        # the recency and layer-budget records below describe is the earlier scorer's choice
        # of the budget this one trained at
        assert record["trained_at_capacities"] == [192, 192, 192, 448]
        assert (record["window"], record["topk"]) == (list(windows), list(topks))
        chosen_again = record["per_layer_training_selection"]
        assert chosen_again["kept"] == "this_run"
        assert record["replaces"]["window"] == trained_window
        record = record["replaces"] | {
            k: record[k] for k in ("recency_selection", "layer_budget_selection")
        }
    assert (record["window"], record["scorer_hidden"]) == (trained_window, 256)
    recency = record["recency_selection"]
    assert recency["kept"] == {"window": window, "lam": lam}
    assert recency["saved_before"] == {"window": trained_window, "lam": 0.0}
    assert recency["recall"]["split"] == "validation"
    assert all(source.startswith("test/") for source in recency["text"]["sequences"])
    jointly = record["layer_budget_selection"]
    assert jointly["kept"] == {"window": list(windows), "topk": list(topks), "lam": shipped_lam}
    first_windows, first_topks = first_layers[policy, budget]
    saved_first = jointly["measured"][0]  # the budget chosen before, at its lam, measured first
    assert (saved_first["window"], saved_first["topk"]) == (list(first_windows), list(first_topks))
    assert saved_first["lam"] == lam
    # kept by its rule: the best setting that keeps window's text replaces the saved one only
    # by a lead beyond the items' noise
    best = jointly["best_eligible"]
    moved = jointly["kept"] != {"window": saved_first["window"], "topk": saved_first["topk"],
                                "lam": saved_first["lam"]}  # fmt: skip
    assert moved == (best["lead"] > best["lead_needed"]) == (policy == "mlp")
    shared = jointly["replaces"]  # the first choice, from the one budget
    assert shared["kept"] == {"window": list(first_windows), "topk": list(first_topks)}
    assert shared["measured"][0]["window"] == [window] * 4  # the one budget, measured first
    for chosen_record in (shared, jointly):
        assert chosen_record["recall"]["split"] == "validation"
        assert all(source.startswith("test/") for source in chosen_record["text"]["sequences"])
    tensors = load_file(folder / "scorer.safetensors")
    assert {name.split(".")[1] for name in tensors} == {"0", "1", "2", "3"}  # one per layer
    assert all(torch.isfinite(t).all() for t in tensors.values())
