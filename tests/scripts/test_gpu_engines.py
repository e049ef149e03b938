"""Engines on a CUDA GPU: TensorRT and AOTInductor (also replayed from a CUDA graph) generate
like the eager model there.

Skipped on machines without CUDA (and, for TensorRT, without torch-tensorrt): run them with
``scripts/gpu_check.sh`` where a GPU is available.
"""

import importlib.util

import pytest
import torch
from tiny_models import prompt, tiny_qwen3

import kvpop_compile as kc

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
needs_tensorrt = pytest.mark.skipif(
    importlib.util.find_spec("torch_tensorrt") is None, reason="needs torch-tensorrt"
)


@needs_cuda
@pytest.mark.parametrize("format", ["aoti", pytest.param("tensorrt", marks=needs_tensorrt)])
def test_gpu_engine_generates_the_eager_tokens(format, tmp_path):
    model = kc.transform(tiny_qwen3().cuda(), kc.KVpopConfig(sinks=2, window=4, topk=10))
    ids = prompt(length=12, batch=1).cuda()
    expected = kc.generate(model, ids, 100).cpu()
    runner = kc.load(kc.export(model, tmp_path / format, format))
    assert torch.equal(runner.generate(ids, 100), expected)


@needs_cuda
def test_aoti_engine_replayed_from_a_cuda_graph_generates_the_eager_tokens(tmp_path):
    model = kc.transform(tiny_qwen3().cuda(), kc.KVpopConfig(sinks=2, window=4, topk=10))
    ids = prompt(length=12, batch=1).cuda()
    expected = kc.generate(model, ids, 100).cpu()
    runner = kc.load(kc.export(model, tmp_path / "aoti", "aoti"), cuda_graph=True)
    assert torch.equal(runner.generate(ids, 100), expected)
    assert runner.captured is not None
    # A second sequence reuses the graph: the cache's tensors never move.
    graph = runner.captured.graph
    assert torch.equal(runner.generate(ids, 100), expected)
    assert runner.captured.graph is graph


@needs_cuda
@needs_tensorrt
def test_compile_with_tensorrt_backend_matches_eager():
    model = kc.transform(tiny_qwen3().cuda(), kc.KVpopConfig(sinks=2, window=4, topk=10))
    ids = prompt(length=12, batch=1).cuda()
    step = kc.compile(model, backend="tensorrt")
    assert torch.equal(kc.generate(model, ids, 50, step=step), kc.generate(model, ids, 50))
