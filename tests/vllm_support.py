"""Shared pieces of the vLLM tests: prompts from held-out code, engines on the embedded model,
and the references they are compared with (transformers' greedy decoding and ``kc.generate``).

vLLM is not a dependency of the main test venv: these tests run where it is installed
(``.ci/run`` builds ``.venv-ci-vllm`` with vLLM's CPU build for them).
"""

from __future__ import annotations

import gc
import os

import pytest
import torch

vllm = pytest.importorskip(
    "vllm", reason="vLLM is not installed in this venv; .ci/run runs these tests in .venv-ci-vllm"
)

import kvpop_compile as kc  # noqa: E402
from kvpop_compile.config import KVpopConfig  # noqa: E402
from kvpop_compile.embedded import EMBEDDED_MODEL, load_embedded_model  # noqa: E402
from kvpop_compile.embedded.corpus import read_held_out  # noqa: E402
from kvpop_compile.vllm import engine_kwargs, serve_settings  # noqa: E402

NEW_TOKENS = 24
PROMPT_LENGTHS = (97, 180, 333, 420, 611, 700)
"""Prompt lengths in tokens (bytes): every one longer than the small budgets' capacity, and of
different lengths, so rows of one batch are at different positions."""
SMALL = KVpopConfig(sinks=4, window=16, topk=44)
"""A capacity of 64: every prompt evicts."""
POOL_GIB = 1
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(POOL_GIB))


def prompts() -> list[list[int]]:
    """Byte prompts cut from held-out standard-library files, one per :data:`PROMPT_LENGTHS`."""
    texts = [t.encode() for t in read_held_out().values()]
    texts = [t for t in texts if len(t) > max(PROMPT_LENGTHS)]
    return [list(texts[i][:n]) for i, n in enumerate(PROMPT_LENGTHS)]


def engine(settings=None, architecture="Qwen3ForCausalLM", **options):
    """A ``vllm.LLM`` on the embedded model (or ``model=``, a checkpoint of ``architecture``)
    in float32, eager, taking token ids; with ``settings``
    (:class:`~kvpop_compile.vllm.ServeSettings`) the KVpop plugin serves it."""
    kwargs = {
        "model": str(EMBEDDED_MODEL), "dtype": "float32", "enforce_eager": True,
        "skip_tokenizer_init": True, "max_model_len": 2048, "seed": 0,
    }  # fmt: skip
    if settings is not None:
        kwargs |= engine_kwargs(architecture, settings)
    return vllm.LLM(**(kwargs | options))


def greedy(llm, token_prompts: list[list[int]], new_tokens: int = NEW_TOKENS) -> list[list[int]]:
    """The engine's greedy continuations, all prompts submitted together."""
    from vllm.inputs import TokensPrompt

    params = vllm.SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in token_prompts], params)
    return [list(o.outputs[0].token_ids) for o in outputs]


def served(token_prompts, settings=None, **options) -> list[list[int]]:
    """Start an engine, decode ``token_prompts`` greedily, shut it down."""
    llm = engine(settings, **options)
    try:
        return greedy(llm, token_prompts)
    finally:
        shutdown(llm)


def shutdown(llm) -> None:
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


def transformers_greedy(token_prompts) -> list[list[int]]:
    model = load_embedded_model()
    return [
        model.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS, do_sample=False)[0, len(p):]
        .tolist()
        for p in token_prompts
    ]  # fmt: skip


def kvpop_greedy(token_prompts, config: KVpopConfig, scorer_path=None) -> list[list[int]]:
    """``kc.generate``'s greedy continuation of each prompt alone."""
    model = kc.transform(load_embedded_model(), config)
    if scorer_path is not None:
        kc.load_scorer(model, scorer_path)
    return [
        kc.generate(model, torch.tensor([p]), NEW_TOKENS, eos_token_id=None)[0, len(p) :].tolist()
        for p in token_prompts
    ]


__all__ = [
    "NEW_TOKENS", "POOL_GIB", "SMALL", "engine", "greedy", "kvpop_greedy", "prompts", "served",
    "serve_settings", "shutdown", "transformers_greedy", "vllm",
]  # fmt: skip
