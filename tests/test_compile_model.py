"""kvpop_compile.compile: the whole decode step in one graph, no recompilation, same tokens."""

import torch
from tiny_models import prompt, tiny_qwen3
from torch._inductor.compile_fx import compile_fx

import kvpop_compile as kc


def test_compiled_decode_step_is_one_graph_for_200_steps_and_matches_eager():
    torch._dynamo.reset()
    model = kc.transform(tiny_qwen3(), kc.KVpopConfig(sinks=2, window=4, topk=10))
    graphs = []

    def inductor_counting_graphs(gm, example_inputs):
        graphs.append(gm)
        return compile_fx(gm, example_inputs)

    # kc.compile with a recording backend: the same call with backend="inductor" is the API.
    step = torch.compile(
        lambda token, position, cache: kc.decode_one_token(model, token, position, cache),
        backend=inductor_counting_graphs,
        fullgraph=True,
    )
    ids = prompt(length=12)
    compiled = kc.generate(model, ids, 201, step=step)  # 200 compiled decode steps
    eager = kc.generate(model, ids, 201)
    assert len(graphs) == 1  # fullgraph: one graph, never recompiled
    names = {str(node.target) for node in graphs[0].graph.nodes}
    assert {"kvpop.update_cache", "kvpop.decode_attention"} <= names
    assert torch.equal(compiled, eager)


def test_compile_returns_a_working_inductor_step():
    torch._dynamo.reset()
    model = kc.transform(tiny_qwen3(), kc.KVpopConfig(sinks=1, window=2, topk=3))
    ids = prompt(length=5, batch=1)
    assert torch.equal(
        kc.generate(model, ids, 4, step=kc.compile(model)), kc.generate(model, ids, 4)
    )
