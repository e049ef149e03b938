"""Shared pieces of the vLLM tests: prompts from held-out code, engines on the embedded model,
and the references they are compared with (transformers' greedy decoding and ``kc.generate``).

vLLM is not a dependency of the main test venv: these tests run where it is installed
(``.ci/run`` builds ``.venv-ci-vllm`` with vLLM's CPU build for them).
"""

from __future__ import annotations

import gc
import importlib
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
from kvpop_compile.generation import decode_one_token, new_cache, prefill  # noqa: E402
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


def kvpop_model(config: KVpopConfig, scorer_path=None):
    """The embedded model transformed with ``config``, with the scorer in ``scorer_path``."""
    model = kc.transform(load_embedded_model(), config)
    if scorer_path is not None:
        kc.load_scorer(model, scorer_path)
    return model


def kvpop_greedy(token_prompts, config: KVpopConfig, scorer_path=None) -> list[list[int]]:
    """``kc.generate``'s greedy continuation of each prompt alone."""
    model = kvpop_model(config, scorer_path)
    return [
        kc.generate(model, torch.tensor([p]), NEW_TOKENS, eos_token_id=None)[0, len(p) :].tolist()
        for p in token_prompts
    ]


ROUNDING = 1e-5
"""Two priorities or two logits closer than this are decided by float rounding: vLLM's
kernels and torch's agree to about 1e-6 in float32 (the logits of the first tokens agree to
every printed digit), so which of the two wins may differ between them."""


def first_undecided(prompt: list[int], config: KVpopConfig, scorer_path=None) -> int | None:
    """The index of the first of ``kc.generate``'s :data:`NEW_TOKENS` greedy tokens after
    ``prompt`` that float rounding may decide: a decode step's eviction compares priorities
    closer than :data:`ROUNDING` (the token leaving the window against the pool's weakest, or,
    where it enters, the weakest against the next), or its argmax is between logits that close.
    None where every choice is decided by more; an exact tie is decided (by age, alike in both).
    The prompt is prefilled as ``kc.generate`` does it, so a decode step meets the pool it
    meets there: a byte's key computed in a prefill and again in a decode step may differ in
    the last bit, a tie in exact arithmetic that rounding breaks either way."""
    model = kvpop_model(config, scorer_path)
    steps = importlib.import_module("kvpop_compile.runtime.decode_step")
    original = steps.update_state_
    gaps: list[float] = []

    def spy(state, leaving, priority, *args, **kwargs):
        # The leaving token against the pool's weakest entry, and, where it enters, the weakest
        # against the next (which of the two it replaces). -inf marks a free slot.
        two = state.priorities.float().topk(2, dim=-1, largest=False).values  # (B, H, 2)
        weakest, next_weakest = two.unbind(-1)
        new = priority.float()
        enters = (new - weakest).abs(), torch.where(new > weakest, next_weakest - weakest, 0.0)
        # An exact tie is no close call: equal inputs (a byte's key in the first layer) give
        # equal priorities in both, and both break the tie by age.
        gap = torch.stack(enters)
        close = (leaving.position >= 0) & torch.isfinite(two).all(-1) & (gap > 0)
        gaps.append(float(gap[close].min()) if bool(close.any()) else float("inf"))
        return original(state, leaving, priority, *args, **kwargs)

    def close_call() -> bool:
        tied = min(gaps, default=float("inf")) < ROUNDING
        gaps.clear()
        return tied

    steps.update_state_ = spy
    try:
        cache = new_cache(model)
        with torch.no_grad():
            logits = prefill(model, torch.tensor([prompt]), cache)
            logits = logits[:, -1] if logits.dim() == 3 else logits
            if close_call():  # attention-fed scorers prefill step by step
                return 0
            for index in range(NEW_TOKENS):
                top = logits[0].topk(2).values
                if float(top[0] - top[1]) < ROUNDING:
                    return index
                token = logits[0].argmax().view(1, 1)
                logits = decode_one_token(model, token, None, cache)
                if close_call():
                    return index + 1
    finally:
        steps.update_state_ = original
    return None


def assert_same_as_kc_generate(got, token_prompts, config: KVpopConfig, scorer_path=None):
    """``got`` (an engine's greedy tokens for ``token_prompts``) equals :func:`kvpop_greedy`'s,
    prompt by prompt; a prompt whose tokens differ must have a choice that float rounding
    decides (:func:`first_undecided`), and its tokens must agree up to that choice."""
    want = kvpop_greedy(token_prompts, config, scorer_path)
    for prompt, ours, theirs in zip(token_prompts, got, want, strict=True):
        if ours == theirs:
            continue
        undecided = first_undecided(prompt, config, scorer_path)
        assert undecided is not None, (
            f"a {len(prompt)}-token prompt's tokens differ where no choice is a near-tie:\n"
            f"{ours}\n{theirs}"
        )
        assert ours[:undecided] == theirs[:undecided], (ours, theirs, undecided)
    return want


__all__ = [
    "NEW_TOKENS", "POOL_GIB", "ROUNDING", "SMALL", "assert_same_as_kc_generate", "engine",
    "first_undecided", "greedy", "kvpop_greedy", "prompts", "served",
    "serve_settings", "shutdown", "transformers_greedy", "vllm",
]  # fmt: skip
