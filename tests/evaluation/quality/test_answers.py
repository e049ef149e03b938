"""Exact-match answers to a user's own questions: every method answers the same items."""

import torch
from tiny_models import tiny_qwen3

from kvpop_compile.evaluation.methods import methods
from kvpop_compile.evaluation.own_data import AnswerItem
from kvpop_compile.evaluation.quality.answers import greedy_answer, run_answers


def test_exact_match_counts_full_attentions_own_answers():
    # Answers are full attention's greedy tokens: full attention matches all of them, and so
    # does a budget roomy enough to keep every prompt whole; items of two lengths run apart.
    model = tiny_qwen3()
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 256, (n,), generator=generator) for n in (30, 30, 45)]
    items = [
        AnswerItem(f"item {i}", p, greedy_answer(model, p[None], 4)[0])
        for i, p in enumerate(prompts)
    ]
    length = 2048  # the 75% budget keeps 512 tokens: every prompt fits
    results = run_answers(model, items, methods(("window", "h2o"), ("75%",), length), batch=2,
                          progress=False)  # fmt: skip
    for record in results["methods"].values():
        assert record["prefill"]["answers"] == [1.0, 1.0, 1.0]
    assert results["prompt_tokens"] == [30, 30, 45] and results["answer_tokens"] == [4, 4, 4]
