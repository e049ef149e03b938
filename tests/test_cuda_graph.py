"""``compile(model, cuda_graph=True)``: the compiled decode step replayed from one CUDA graph.

On the CPU: the property a replay relies on (the compiled step updates every cache tensor in
place, so the addresses captured stay the cache's) and the refusals. On a CUDA GPU: the
replayed step generates the eager tokens, the capture leaves the cache as it was, and another
cache or batch is captured again.
"""

import pytest
import torch
from tiny_models import prompt, tiny_qwen3

import kvpop_compile as kc
from kvpop_compile.runtime.dispatch import interpreting

CONFIG = kc.KVpopConfig(sinks=2, window=4, topk=10)
needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available() or interpreting(),
    reason="needs a CUDA GPU with compiled (not interpreted) Triton kernels",
)


def _state_tensors(cache):
    return [t for layer in cache.layers for t in layer.state.tensors()]


def test_compiled_step_updates_every_cache_tensor_in_place():
    # A CUDA graph replays reads and writes at the addresses it captured: a step that gave the
    # cache new tensors would leave the replays reading and writing stale ones.
    torch._dynamo.reset()
    model = kc.transform(tiny_qwen3(), CONFIG)
    step = kc.compile(model)
    cache = kc.new_cache(model)
    logits = kc.prefill(model, prompt(length=12), cache)
    tensors = _state_tensors(cache)
    addresses = [t.data_ptr() for t in tensors]
    before = [t.clone() for t in tensors]
    for _ in range(CONFIG.capacity + 2):  # past the capacity: every step evicts
        logits = step(logits.argmax(-1, keepdim=True), None, cache)
    assert [t.data_ptr() for t in _state_tensors(cache)] == addresses
    assert any(not torch.equal(t, b) for t, b in zip(tensors, before, strict=True))


def test_cuda_graph_is_refused_off_cuda_and_named_when_misspelled():
    model = kc.transform(tiny_qwen3(), CONFIG)
    with pytest.raises(
        ValueError, match="cuda_graph=True needs the model on a CUDA device, got cpu"
    ):
        kc.compile(model, cuda_graph=True)
    with pytest.raises(TypeError, match="cuda_graph must be True or False, got 'yes'"):
        kc.compile(model, cuda_graph="yes")


@needs_cuda
def test_cuda_graph_step_generates_the_eager_tokens_and_recaptures_for_a_new_cache():
    torch._dynamo.reset()
    model = kc.transform(tiny_qwen3().cuda(), CONFIG)
    step = kc.compile(model, cuda_graph=True)
    for batch in (2, 1):  # a new cache each call, then another batch size: captured again
        ids = prompt(length=12, batch=batch).cuda()
        replayed = kc.generate(model, ids, 40, step=step)
        assert torch.equal(replayed, kc.generate(model, ids, 40))


@needs_cuda
def test_capturing_leaves_the_cache_as_one_eager_step_would():
    torch._dynamo.reset()
    model = kc.transform(tiny_qwen3().cuda(), CONFIG)
    ids = prompt(length=12, batch=2).cuda()
    graph_cache, eager_cache = kc.new_cache(model), kc.new_cache(model)
    token = kc.prefill(model, ids, graph_cache).argmax(-1, keepdim=True)
    kc.prefill(model, ids, eager_cache)
    # The warm-up steps run on the cache itself; the capture must put it back.
    graph_logits = kc.compile(model, cuda_graph=True)(token, None, graph_cache)
    eager_logits = kc.decode_one_token(model, token, None, eager_cache)
    torch.testing.assert_close(graph_logits, eager_logits)
    for got, want in zip(_state_tensors(graph_cache), _state_tensors(eager_cache), strict=True):
        torch.testing.assert_close(got, want)
