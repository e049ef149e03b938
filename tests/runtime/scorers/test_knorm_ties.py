"""``knorm`` scores equal keys bit-identically on every path, so ties break the same way.

A repeated token has the same first-layer key as its earlier copy, so the two tie. Prefill
scores a key among a chunk's, decode one at a time, and compiled decode with Inductor's
kernels, which order and fuse a reduction's arithmetic their own way: a score one rounding
apart on one path would evict the other copy there, and the generated tokens would part.
"""

import pytest
import torch
from tiny_models import prompt, tiny_qwen3

import kvpop_compile as kc
from kvpop_compile.runtime.scorers.heuristics import KNormScorer

HEADS = 2


def scorer_with_norm(head_dim: int, uniform: bool) -> KNormScorer:
    """A knorm scorer reading keys before an RMSNorm whose weights are all 1 (a fresh model's)
    or drawn around 1 (a trained one's)."""
    scorer = KNormScorer(HEADS, head_dim)
    norm = torch.nn.RMSNorm(head_dim, eps=1e-6)
    if not uniform:
        generator = torch.Generator().manual_seed(head_dim)
        with torch.no_grad():
            norm.weight.copy_(1 + 0.5 * torch.randn(head_dim, generator=generator))
    scorer.read_keys_before_norm(norm, "weight", norm.eps)
    return scorer


def keys_with_repeats(head_dim: int, length: int = 12) -> torch.Tensor:
    """``(3, HEADS, length, head_dim)`` keys over several orders of magnitude, each key of the
    first half repeated in the second."""
    generator = torch.Generator().manual_seed(head_dim)
    half = length // 2
    scale = 10.0 ** torch.empty(3, HEADS, half, 1).uniform_(-3, 2, generator=generator)
    keys = scale * torch.randn(3, HEADS, half, head_dim, generator=generator)
    return torch.cat([keys, keys], dim=2)


def kvpress_score(keys: torch.Tensor, scorer: KNormScorer) -> torch.Tensor:
    """``-||k||`` in float64 of the keys after the scorer's norm (or as given without one),
    plus the constant ``||w||`` the scorer adds: ``(B, H, N)``."""
    norm = scorer.__dict__["_key_norm"]
    x = keys.double()
    if norm is None:
        return -x.norm(dim=-1)
    weight = norm.weight.detach().double()
    normed = weight * x / (x.square().mean(dim=-1, keepdim=True) + scorer.key_norm_eps).sqrt()
    return weight.norm() - normed.norm(dim=-1)


# uniform None: the scorer on its own, scoring the keys it is given. 80 is no power of two.
@pytest.mark.parametrize(("head_dim", "uniform"), [(80, True), (128, False), (16, None)])
def test_equal_keys_score_bit_identically_eager_compiled_chunk_and_token(head_dim, uniform):
    if uniform is None:
        scorer = KNormScorer(HEADS, head_dim)
    else:
        scorer = scorer_with_norm(head_dim, uniform)
    keys = keys_with_repeats(head_dim)
    positions = torch.arange(keys.shape[2])
    compiled = torch.compile(scorer.score_tokens, fullgraph=True, dynamic=False)
    chunk = scorer.score_tokens(keys, keys, positions)
    half = keys.shape[2] // 2
    assert torch.equal(chunk[..., :half], chunk[..., half:])  # each copy ties its repeat
    assert torch.equal(compiled(keys, keys, positions), chunk)
    for t in range(keys.shape[2]):  # one token at a time, as decode scores them
        token = keys[:, :, t]
        assert torch.equal(scorer.score_tokens(token, token, positions[t]), chunk[..., t])
        assert torch.equal(compiled(token, token, positions[t]), chunk[..., t])
    # The scores are kvpress's, in kvpress's order (ties in index order on both sides).
    expected = kvpress_score(keys, scorer)
    torch.testing.assert_close(chunk.double(), expected, rtol=1e-6, atol=1e-6 * head_dim**0.5)
    order = chunk.argsort(dim=-1, stable=True)
    assert torch.equal(order, expected.argsort(dim=-1, stable=True))


def repeated_prompt(seed: int, length: int, copies: int = 3) -> torch.Tensor:
    """``(1, length * copies)`` token ids: one random run of ``length`` tokens, repeated."""
    return prompt(seed, batch=1, length=length).repeat(1, copies)


def knorm_model() -> torch.nn.Module:
    # Capacity 8: over 200 steps most tokens are evicted, many of them against a tie.
    config = kc.KVpopConfig(sinks=1, window=4, topk=3, scorer="knorm")
    return kc.transform(tiny_qwen3(0), config)


def test_compiled_generation_of_repeated_tokens_matches_eager():
    model = knorm_model()
    ids = repeated_prompt(5, 6)
    eager = kc.generate(model, ids, 200, eos_token_id=None)
    compiled = kc.generate(model, ids, 200, step=kc.compile(model), eos_token_id=None)
    assert torch.equal(compiled, eager)


def test_compiled_generation_of_a_padded_batch_of_repeated_tokens_matches_eager():
    model = knorm_model()
    long, short = repeated_prompt(5, 6), repeated_prompt(6, 5)
    padding = long.shape[1] - short.shape[1]
    ids = torch.cat([long, torch.cat([torch.zeros(1, padding, dtype=torch.long), short], 1)])
    mask = torch.ones_like(ids)
    mask[1, :padding] = 0
    eager = kc.generate(model, ids, 200, attention_mask=mask, eos_token_id=None)
    step = kc.compile(model)
    compiled = kc.generate(model, ids, 200, attention_mask=mask, step=step, eos_token_id=None)
    assert torch.equal(compiled, eager)
