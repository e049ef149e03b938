"""The decode step is one static graph: it compiles with ``fullgraph=True`` and the same
compiled graph serves every step (no ``.item()``, no Python branch on data). On CPU the ops
lower from their references; on CUDA Inductor launches the ops' Triton kernels in that graph."""

import pytest
import torch
from torch._inductor.compile_fx import compile_fx
from torch._inductor.utils import run_and_get_code

from kvpop_compile import KVpopConfig
from kvpop_compile.runtime import BoundedCacheState, build_scorer, decode_step
from kvpop_compile.runtime.dispatch import interpreting

CUDA = pytest.param(
    "cuda",
    marks=pytest.mark.skipif(
        not torch.cuda.is_available() or interpreting(),
        reason="needs a CUDA GPU with compiled (not interpreted) Triton kernels",
    ),
)


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize(("kind", "span"), [("memory", 0), ("memory", 2), ("h2o", 0)])
def test_compiled_decode_step_has_one_graph_and_matches_eager(kind, span, device):
    torch._dynamo.reset()
    config = KVpopConfig(sinks=2, window=3, topk=5, lam=0.01, scorer=kind, priority_span=span)
    scorer = build_scorer(config, 2, 16).to(device)
    compiled_state = BoundedCacheState.empty(config, scorer, batch=2, head_dim=16, device=device)
    eager_state = BoundedCacheState.empty(config, scorer, batch=2, head_dim=16, device=device)

    def step(state, q, k, raw_k, v):
        return decode_step(state, q, k, raw_k, v, scorer=scorer, config=config, scale=0.25)

    graphs = []

    def inductor_recording_graphs(gm, example_inputs):
        graphs.append({str(node.target) for node in gm.graph.nodes})
        return compile_fx(gm, example_inputs)

    compiled = torch.compile(step, backend=inductor_recording_graphs, fullgraph=True)
    # 30 steps cross every phase: sinks filling, window filling, pool filling, evicting.
    code = []
    for index in range(30):
        q = torch.randn(2, 4, 1, 16, device=device)
        k, raw_k, v = torch.randn(3, 2, 2, 1, 16, device=device)
        if index == 0:
            out, code = run_and_get_code(compiled, compiled_state, q, k, raw_k, v)
        else:
            out = compiled(compiled_state, q, k, raw_k, v)
        torch.testing.assert_close(out, step(eager_state, q, k, raw_k, v), rtol=1e-5, atol=1e-5)
    assert len(graphs) == 1  # compiled once, reused for every step
    assert {"kvpop.update_cache", "kvpop.decode_attention"} <= graphs[0]
    if device == "cuda":  # the hand-written kernels, not Inductor's lowering of the references
        for kernel in ("_update_cache_kernel", "_partial_kernel"):
            assert any(kernel in source for source in code), kernel
    assert compiled_state.cached_positions() == eager_state.cached_positions()
