"""The vLLM plugin gives the tokens of the references it stands for: stock vLLM those of
transformers, the plugin with room for every token those of stock vLLM, and the plugin with
eviction those of ``kc.generate`` for each request alone, for every scorer and under vLLM's
chunked prefill and mixed prefill/decode batches. Float32 on the CPU; exact token equality."""

from __future__ import annotations

import dataclasses

import pytest
from vllm_support import (
    SMALL,
    kvpop_greedy,
    prompts,
    serve_settings,
    served,
    transformers_greedy,
)

from kvpop_compile.embedded import EMBEDDED_MODEL

SCORERS_DIR = EMBEDDED_MODEL.parent / "scorers"


@pytest.fixture(scope="module")
def token_prompts():
    return prompts()


@pytest.fixture(scope="module")
def stock(token_prompts):
    return served(token_prompts)


def test_stock_vllm_equals_transformers_greedy(token_prompts, stock):
    assert stock == transformers_greedy(token_prompts)


def test_plugin_with_room_for_every_token_equals_stock_vllm(token_prompts, stock):
    roomy = dataclasses.replace(SMALL, topk=2048, scorer="memory")
    assert served(token_prompts, serve_settings(config=roomy)) == stock


@pytest.mark.parametrize("scorer", ["window", "knorm", "random", "h2o", "tova", "memory", "mlp"])
def test_plugin_with_eviction_equals_kc_generate(token_prompts, stock, scorer):
    config = dataclasses.replace(SMALL, scorer=scorer)
    got = served(token_prompts, serve_settings(config=config))
    assert got == kvpop_greedy(token_prompts, config)
    assert got != stock  # the budget evicts what full attention reads


@pytest.mark.parametrize("folder", ["memory-256", "mlp-256"])
def test_shipped_trained_scorers_equal_kc_generate(token_prompts, folder):
    settings = serve_settings(SCORERS_DIR / folder)
    got = served(token_prompts, settings)
    assert got == kvpop_greedy(token_prompts, settings.config, SCORERS_DIR / folder)


@pytest.mark.parametrize("batched_tokens", [16, 100])
def test_chunked_prefill_and_mixed_batches_equal_kc_generate(token_prompts, batched_tokens):
    # At most 3 requests at once and a small token budget per step: prompts enter in chunks,
    # next to other requests' decode steps, and later requests wait for a free row.
    config = dataclasses.replace(SMALL, scorer="memory", priority_span=3)
    got = served(
        token_prompts, serve_settings(config=config),
        max_num_batched_tokens=batched_tokens, max_num_seqs=3,
    )  # fmt: skip
    assert got == kvpop_greedy(token_prompts, config)
