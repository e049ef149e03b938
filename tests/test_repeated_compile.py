"""``kc.compile`` works any number of times in one process, as a notebook that re-runs its
transform-and-compile cell needs: each compiled step keeps its graphs to itself, so neither
torch.compile's recompile limit nor a step compiled earlier is affected by the next, and a
step dropped takes its graphs (and its model) with it.
"""

import gc
import weakref

import torch
from tiny_models import prompt, tiny_qwen3

import kvpop_compile as kc

# More compiled models than torch.compile keeps graphs for on one code object
# (recompile_limit, 8).
COMPILES = 10
NEW_TOKENS = 4


def tiny_model(seed: int) -> torch.nn.Module:
    # Capacity 5 for a 5-token prompt: every decode step evicts.
    config = kc.KVpopConfig(sinks=1, window=2, topk=2)
    return kc.transform(tiny_qwen3(seed), config)


def test_compiling_model_after_model_in_one_process_gives_eager_tokens():
    ids = prompt(0, batch=1, length=5)
    first = tiny_model(0)
    first_step = kc.compile(first)
    first_tokens = kc.generate(first, ids, NEW_TOKENS, step=first_step, eos_token_id=None)
    assert torch.equal(first_tokens, kc.generate(first, ids, NEW_TOKENS, eos_token_id=None))
    released = []
    for seed in range(1, COMPILES):  # as a re-run cell does: the previous model is dropped
        model = tiny_model(seed)
        step = kc.compile(model)
        compiled = kc.generate(model, ids, NEW_TOKENS, step=step, eos_token_id=None)
        assert torch.equal(compiled, kc.generate(model, ids, NEW_TOKENS, eos_token_id=None)), seed
        released.append(weakref.ref(model))
        del model, step
    gc.collect()
    # Nothing left behind by a dropped step holds its model.
    assert [ref() is None for ref in released] == [True] * (COMPILES - 1)
    # The step compiled first still runs the graph it compiled: nothing was reset since.
    with torch.compiler.set_stance("fail_on_recompile"):
        again = kc.generate(first, ids, NEW_TOKENS, step=first_step, eos_token_id=None)
    assert torch.equal(again, first_tokens)
