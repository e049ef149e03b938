"""The one ``weights_sha256`` (engine manifests, recall runs, kvpress's results) and
``items_sha256``: what they digest, and that the digests recorded in the results files are
this function's."""

import copy
import json
from pathlib import Path

import torch
from tiny_models import tiny_qwen3

import kvpop_compile as kc
from kvpop_compile.embedded import load_embedded_model
from kvpop_compile.embedded.recall import recall_items
from kvpop_compile.fingerprints import items_sha256, weights_sha256

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


def test_the_recall_results_record_the_embedded_models_digest():
    # recall.md compares this digest with kvpress_recall.json's, and a resumed run with
    # recall.json's: the function must stay the one they were recorded with.
    recorded = json.loads((RESULTS / "recall.json").read_text())["model_sha256"]
    assert weights_sha256(load_embedded_model()) == recorded


def test_the_digest_follows_the_weights_and_the_scorers_not_the_object():
    model = tiny_qwen3()
    assert weights_sha256(model) == weights_sha256(copy.deepcopy(model))
    assert weights_sha256(model) != weights_sha256(tiny_qwen3(seed=1))
    assert weights_sha256(model) != weights_sha256(copy.deepcopy(model).to(torch.bfloat16))
    changed = copy.deepcopy(model)
    with torch.no_grad():
        changed.lm_head.weight[0, 0] += 1.0
    assert weights_sha256(changed) != weights_sha256(model)
    # A transformed model's scorer parameters are part of its weights.
    config = kc.KVpopConfig(sinks=2, window=6, topk=16, scorer="memory")
    memory = kc.transform(tiny_qwen3(), config)
    other = kc.transform(tiny_qwen3(), config)
    with torch.no_grad():
        next(p for n, p in other.named_parameters() if "scorer" in n).add_(1.0)
    assert weights_sha256(memory) != weights_sha256(other)


def test_items_digest_their_prompts_and_answers_in_order():
    items = recall_items("held_out", "lookup", 1024, 2, 0, families="held_out")
    assert items_sha256(items) == items_sha256(list(items))
    assert items_sha256(items) != items_sha256(items[::-1])
    assert items_sha256(items[:1]) != items_sha256(items)
