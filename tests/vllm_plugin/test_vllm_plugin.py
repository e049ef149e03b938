"""The vLLM plugin gives the tokens of the references it stands for: stock vLLM those of
transformers, the plugin with room for every token those of stock vLLM, and the plugin with
eviction those of ``kc.generate`` for each request alone, for every scorer and under vLLM's
chunked prefill and mixed prefill/decode batches. Float32 on the CPU; exact token equality,
except after a choice that float rounding decides: vLLM's kernels and torch's round differently,
so where ``kc.generate`` compares two priorities or two logits closer than
``vllm_support.ROUNDING`` the tokens must agree only up to that choice (``first_undecided``)."""

from __future__ import annotations

import dataclasses
import json
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import torch
from script_support import ROOT, copy_of_shipped_scorer, load_script
from vllm_support import (
    NEW_TOKENS,
    POOL_GIB,
    SMALL,
    assert_same_as_kc_generate,
    engine,
    first_undecided,
    prompts,
    serve_settings,
    served,
    shutdown,
    transformers_greedy,
    vllm,
)

import kvpop_compile as kc
from kvpop_compile.embedded import EMBEDDED_MODEL, load_embedded_model
from kvpop_compile.runtime.scorers.registry import build_scorer
from kvpop_compile.vllm import engine_kwargs
from kvpop_compile.vllm.pages import page_bytes, page_layout
from kvpop_compile.vllm.serve import server_command

SCORERS_DIR = EMBEDDED_MODEL.parent / "scorers"
SERVER_START_S = 600


@pytest.fixture(scope="module")
def token_prompts():
    return prompts()


@pytest.fixture(scope="module")
def stock(token_prompts):
    return served(token_prompts)


def test_a_policy_without_close_calls_is_compared_token_for_token(token_prompts):
    # The window policy's priorities are positions, never within rounding of each other: the
    # near-tie allowance leaves every one of its tokens to the exact comparison.
    config = dataclasses.replace(SMALL, scorer="window")
    assert [first_undecided(p, config) for p in token_prompts] == [None] * len(token_prompts)


def test_stock_vllm_equals_transformers_greedy(token_prompts, stock):
    assert stock == transformers_greedy(token_prompts)


def test_plugin_with_room_for_every_token_equals_stock_vllm(token_prompts, stock):
    roomy = dataclasses.replace(SMALL, topk=2048, scorer="memory")
    assert served(token_prompts, serve_settings(config=roomy)) == stock


@pytest.mark.parametrize("scorer", ["window", "knorm", "random", "h2o", "tova", "memory", "mlp"])
def test_plugin_with_eviction_equals_kc_generate(token_prompts, stock, scorer):
    config = dataclasses.replace(SMALL, scorer=scorer)
    got = served(token_prompts, serve_settings(config=config))
    assert_same_as_kc_generate(got, token_prompts, config)
    assert got != stock  # the budget evicts what full attention reads


@pytest.mark.parametrize("policy", ["memory", "mlp"])
def test_shipped_trained_scorers_equal_kc_generate(token_prompts, policy, tmp_path):
    # At the one budget each was chosen at before its memory was shared between the layers:
    # vLLM serves one budget in every layer.
    folder = copy_of_shipped_scorer(tmp_path, policy, 256)
    settings = serve_settings(folder)
    got = served(token_prompts, settings)
    assert_same_as_kc_generate(got, token_prompts, settings.config, folder)


@pytest.mark.parametrize("batched_tokens", [16, 100])
def test_chunked_prefill_and_mixed_batches_equal_kc_generate(token_prompts, batched_tokens):
    # At most 3 requests at once and a small token budget per step: prompts enter in chunks,
    # next to other requests' decode steps, and later requests wait for a free row.
    config = dataclasses.replace(SMALL, scorer="memory", priority_span=3)
    got = served(
        token_prompts, serve_settings(config=config),
        max_num_batched_tokens=batched_tokens, max_num_seqs=3,
    )  # fmt: skip
    assert_same_as_kc_generate(got, token_prompts, config)


def test_prompts_of_one_length_prefill_in_one_batched_step_and_equal_kc_generate(token_prompts):
    # Four prompts of one length scheduled together: their prefill chunks are one batched chunk
    # step over four pages, and with a 64-token step budget vLLM cuts them into equal chunks.
    same = [p[:150] for p in token_prompts[1:5]]
    config = dataclasses.replace(SMALL, scorer="memory", priority_span=3)
    assert_same_as_kc_generate(served(same, serve_settings(config=config)), same, config)
    got = served(same, serve_settings(config=config), max_num_batched_tokens=64)
    assert_same_as_kc_generate(got, same, config)


def test_a_pool_smaller_than_the_batch_queues_requests_and_keeps_their_tokens(token_prompts):
    # Two pages per layer for six requests: vLLM admits two at a time, the rest wait for a
    # page, and each request still gets the tokens it gets alone.
    config = dataclasses.replace(SMALL, scorer="knorm")
    got = served(token_prompts, serve_settings(config=config), num_gpu_blocks_override=2)
    assert_same_as_kc_generate(got, token_prompts, config)


def test_requests_preempted_mid_generation_are_recomputed_from_an_empty_page(
    token_prompts, monkeypatch
):
    # vLLM preempts a running request when it needs a block that is not free, and recomputes it
    # later from its prompt and the tokens it has produced. A KVpop request never needs another
    # page, so this forces it: once every request has decoded a few tokens, all are preempted
    # (reset_prefix_cache's reset_running_requests, vLLM's own preemption path). Each one's
    # page must restart empty, and its tokens stay those of the request alone.
    from vllm.inputs import TokensPrompt

    import kvpop_compile.vllm.layer as layer

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the model runs in this process
    resets = []
    original = layer.reset_rows_

    def counted(pool, rows):
        resets.append(len(rows))
        original(pool, rows)

    monkeypatch.setattr(layer, "reset_rows_", counted)
    config = dataclasses.replace(SMALL, scorer="memory", priority_span=3)
    llm = engine(serve_settings(config=config))
    try:
        core = llm.llm_engine
        params = vllm.SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
        for i, prompt in enumerate(token_prompts):
            core.add_request(str(i), TokensPrompt(prompt_token_ids=prompt), params)
        produced: dict[str, list[int]] = {}
        preempted_at = None
        while core.has_unfinished_requests():
            for output in core.step():
                produced[output.request_id] = list(output.outputs[0].token_ids)
            done = [len(produced.get(str(i), [])) for i in range(len(token_prompts))]
            if preempted_at is None and min(done) >= 6:
                assert max(done) < NEW_TOKENS  # every request is still running
                assert core.reset_prefix_cache(reset_running_requests=True)
                preempted_at = done
    finally:
        shutdown(llm)
    assert preempted_at is not None
    layers = load_embedded_model().config.num_hidden_layers
    # Each request's page was reset at its first prefill and again at its recomputation.
    assert sum(resets) == 2 * len(token_prompts) * layers
    got = [produced[str(i)] for i in range(len(token_prompts))]
    assert_same_as_kc_generate(got, token_prompts, config)


def test_vllm_admits_pool_over_layers_times_page_bytes_requests_whatever_their_length():
    config = dataclasses.replace(SMALL, topk=512 - SMALL.sinks - SMALL.window)
    llm = engine(serve_settings(config=config))
    try:
        blocks = llm.llm_engine.vllm_config.cache_config.num_gpu_blocks
    finally:
        shutdown(llm)
    model = load_embedded_model().config
    scorer = build_scorer(config, model.num_key_value_heads, model.head_dim)
    page = page_bytes(page_layout(config, scorer, model.head_dim, torch.float32))
    assert blocks == (POOL_GIB << 30) // (model.num_hidden_layers * page)


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ({"enable_prefix_caching": True}, "prefix caching cannot be used with a bounded cache"),
        (
            {"speculative_config": {"method": "ngram", "num_speculative_tokens": 2,
                                    "prompt_lookup_max": 3}},
            "speculative decoding cannot be used with a bounded cache",
        ),
    ],
)  # fmt: skip
def test_settings_that_would_give_wrong_tokens_are_refused(option, message):
    with pytest.raises(ValueError, match=message):
        engine(serve_settings(config=SMALL), **option)


def test_a_checkpoint_that_is_not_qwen3_is_refused(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1,
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="serves Qwen3ForCausalLM, Qwen3MoeForCausalLM"):
        engine_kwargs("LlamaForCausalLM", serve_settings(config=SMALL))
    # Named as a KVpop architecture through hf_overrides by hand, it is refused at start.
    kwargs = engine_kwargs("Qwen3ForCausalLM", serve_settings(config=SMALL))
    with pytest.raises(ValueError, match="serves 'qwen3' checkpoints; this one is 'llama'"):
        vllm.LLM(model=str(tmp_path), skip_tokenizer_init=True, enforce_eager=True,
                 dtype="float32", **kwargs)  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def test_one_request_through_the_http_server_equals_kc_generate(token_prompts, tmp_path):
    folder = copy_of_shipped_scorer(tmp_path)  # memory-256 at one budget
    settings = serve_settings(folder)
    port = _free_port()
    argv = server_command(EMBEDDED_MODEL, settings, port=port, extra=[
        "--dtype", "float32", "--enforce-eager", "--max-model-len", "2048",
    ])  # fmt: skip
    server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + SERVER_START_S
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5):
                    break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(server.stderr.read().decode()[-3000:]) from None
                time.sleep(2)
        prompt = token_prompts[4]
        answer = _post(f"http://127.0.0.1:{port}/v1/completions", {
            "model": str(EMBEDDED_MODEL), "prompt": bytes(prompt).decode(),
            "max_tokens": NEW_TOKENS, "temperature": 0.0, "ignore_eos": True,
        })  # fmt: skip
    finally:
        server.terminate()
        server.wait(timeout=60)
    got = [list(answer["choices"][0]["text"].encode())]
    assert_same_as_kc_generate(got, [prompt], settings.config, folder)


def test_qwen3_moe_with_eviction_equals_kc_generate(token_prompts, tmp_path):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    config = Qwen3MoeConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        num_experts=4, num_experts_per_tok=2, max_position_embeddings=2048,
        tie_word_embeddings=False,
    )  # fmt: skip
    model = Qwen3MoeForCausalLM(config).eval()
    model.save_pretrained(tmp_path)
    budget = dataclasses.replace(SMALL, scorer="memory")
    got = served(token_prompts, serve_settings(config=budget), model=str(tmp_path),
                 architecture="Qwen3MoeForCausalLM")  # fmt: skip
    bounded = kc.transform(model, budget)
    want = [
        kc.generate(bounded, torch.tensor([p]), NEW_TOKENS, eos_token_id=None)[0, len(p) :].tolist()
        for p in token_prompts
    ]
    assert got == want


def test_serving_benchmark_reports_pages_admitted_and_decode_speeds_of_both_engines(tmp_path):
    # The benchmark at a tiny size, in a process of its own (it runs vLLM's engine core in
    # its process): KVpop's admitted count is the pool over its pages, stock vLLM's the pool's
    # tokens over a request's, and every call's requests prefill in one step (it refuses
    # otherwise), so each speed is of decode steps alone.
    command = [sys.executable, "-m", "benchmarks.vllm_serving", "--contexts", "96,200",
               "--concurrency", "1,3", "--new-tokens", "4", "--capacity", "80",
               "--pool-gib", "1", "--out", str(tmp_path)]  # fmt: skip
    subprocess.run(command, check=True, timeout=SERVER_START_S, cwd=ROOT)
    results = json.loads((tmp_path / "vllm_serving.json").read_text())
    serving = load_script("benchmarks/vllm_serving.py")
    shape = serving.SHAPE
    config = kc.KVpopConfig(sinks=4, window=64, topk=80 - 68, scorer="window")
    scorer = build_scorer(config, shape["num_key_value_heads"], shape["head_dim"])
    page = page_bytes(page_layout(config, scorer, shape["head_dim"], torch.float32))
    pages = (1 << 30) // (shape["num_hidden_layers"] * page)
    assert results["kvpop"]["admitted"] == {"96": pages, "200": pages}
    stock = results["stock"]
    tokens = stock["blocks"] * stock["block_size"]
    assert stock["admitted"] == {"96": tokens // 101, "200": tokens // 205}
    for method in ("stock", "kvpop"):
        speeds = results[method]["decode_tokens_per_s"]
        assert sorted(speeds) == ["200x1", "200x3", "96x1", "96x3"]
        assert all(s > 0 for s in speeds.values())
    text = (tmp_path / "vllm_serving.md").read_text()
    assert f"| 200 | {tokens // 205} | {pages} | {pages / (tokens // 205):.1f}x |" in text
