"""Distillation mode and multi-process training: fine-tuning under the running-top-k mask,
exact resume, and 2 gloo processes (data-parallel scorers; FSDP2-sharded student) ≡ one."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_models import prompt, tiny_qwen3
from training_support import CONFIG, run

# A small held-out split: each evaluation runs the teacher and the student over all of it.
DISTILL = dict(mode="distill", trainable=["mlp"], eval_fraction=0.02)


def test_distillation_fine_tunes_the_student_towards_the_teacher(tmp_path):
    model = tiny_qwen3()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    report = run(tmp_path, 20, model=model, eval_every=20, checkpoint_every=20, **DISTILL)
    kl = [r["kl"] for r in report.history]
    assert sum(kl[-5:]) / 5 < sum(kl[:5]) / 5  # the student moves towards the teacher
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all(".mlp." in n for n in changed)  # only the chosen modules trained
    assert all(p.requires_grad for p in model.parameters())  # restored as it was
    assert report.evaluations[-1]["kl"] >= 0
    # The scorers train too (they are not among the student's chosen modules).
    fresh = kc_scorers(tmp_path / "fresh")
    trained = load_file(report.scorer_path / "scorer.safetensors")
    assert any(not torch.equal(trained[name], fresh[name]) for name in trained)
    with pytest.raises(ValueError, match="mode must be one of scorer, distill; got 'rl'"):
        run(tmp_path / "x", 1, mode="rl")
    with pytest.raises(ValueError, match="no model parameter name contains any of \\['nope'\\]"):
        run(tmp_path / "y", 1, mode="distill", trainable=["nope"])


def kc_scorers(path):
    """The scorers a transformed model starts with, as saved tensors."""
    import kvpop_compile as kc

    model = kc.transform(tiny_qwen3(), CONFIG)
    kc.save_scorer(model, path)
    return load_file(path / "scorer.safetensors")


def test_the_students_scorer_reads_the_keys_before_rope():
    """Each layer's student attention hands its scorer the layer's keys before the rotary
    embedding, ``k_norm(k_proj(hidden))``, recomputed here from the layer's own modules; the
    keys after it differ at every position but the first."""
    from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb

    from kvpop_compile.runtime import build_scorer
    from kvpop_compile.training.objectives import student_attention

    model = tiny_qwen3()
    kv_heads, head_dim = model.config.num_key_value_heads, model.config.head_dim
    scorers = [build_scorer(CONFIG, kv_heads, head_dim, layer) for layer in range(2)]
    received, hidden = [], []
    for scorer in scorers:
        score_sequence = scorer.score_sequence

        def recording(k, v, window, score_sequence=score_sequence):
            received.append(k.detach().clone())
            return score_sequence(k, v, window)

        scorer.score_sequence = recording
    ids = prompt(batch=2, length=40)
    with student_attention(model, CONFIG, scorers) as attentions, torch.no_grad():
        for attention in attentions:
            attention.register_forward_pre_hook(
                lambda _, args, kwargs: hidden.append(kwargs["hidden_states"].clone()),
                with_kwargs=True,
            )
        model(input_ids=ids, use_cache=False)
        shape = (2, 40, kv_heads, head_dim)
        expected = [a.k_norm(a.k_proj(h).view(shape)).transpose(1, 2)
                    for a, h in zip(attentions, hidden, strict=True)]  # fmt: skip
        cos, sin = model.model.rotary_emb(hidden[0], torch.arange(40)[None].expand(2, -1))
    assert len(received) == 2
    for got, raw_k in zip(received, expected, strict=True):
        assert torch.equal(got, raw_k)  # the same modules on the same input
        rotated = apply_rotary_pos_emb(raw_k, raw_k, cos, sin)[1]
        assert (rotated - raw_k)[:, :, 1:].abs().amax(dim=-1).min() > 0


@pytest.mark.parametrize("span", [0, 3])
def test_the_student_keeps_what_the_cache_keeps_under_a_temporal_decay(span):
    """With ``lam > 0`` the priorities are ``rhat_t + lam * t``: the student's attention under
    the running top-k equals the bounded cache's one-shot prefill of the same tokens, and the
    decay changes what is kept (the outputs differ from those at ``lam = 0``)."""
    from kvpop_compile import KVpopConfig
    from kvpop_compile.runtime import BoundedCacheState, build_scorer, chunk_step
    from kvpop_compile.training.student_attention import StudentAttention

    def student_and_cache(lam):
        config = KVpopConfig(sinks=2, window=3, topk=4, lam=lam, scorer="memory", memory_dim=4,
                             memory_value_dim=4, scorer_hidden=8, priority_span=span)  # fmt: skip
        scorer = build_scorer(config, 2, 8)
        student = StudentAttention(config, 8**-0.5)
        student.scorer = scorer
        state = BoundedCacheState.empty(config, scorer, batch=2, head_dim=8)
        cached = chunk_step(state, q, k, raw_k, v, scorer=scorer, config=config, scale=8**-0.5)
        return student(q, k, v, raw_k), cached

    g = torch.Generator().manual_seed(11)
    q = torch.randn(2, 4, 30, 8, generator=g)
    k, raw_k, v = (torch.randn(2, 2, 30, 8, generator=g) for _ in range(3))
    with torch.no_grad():
        decayed, cached = student_and_cache(0.2)
        undecayed, _ = student_and_cache(0.0)
    # Both sum the same float32 terms in another order: a few ulps of unit-scale outputs.
    torch.testing.assert_close(decayed, cached, rtol=1e-5, atol=1e-5)
    assert (decayed - undecayed).abs().max() > 0.1


def test_resumed_distillation_equals_an_uninterrupted_one(tmp_path):
    straight_model, resumed_model = tiny_qwen3(), tiny_qwen3()
    settings = dict(checkpoint_every=1, eval_every=2, **DISTILL)
    straight = run(tmp_path / "straight", 2, model=straight_model, **settings)
    run(tmp_path / "resumed", 1, model=tiny_qwen3(), **settings)
    resumed = run(tmp_path / "resumed", 2, model=resumed_model, **settings)
    assert resumed.history == straight.history
    for (name, a), b in zip(straight_model.named_parameters(), resumed_model.parameters(),
                            strict=True):  # fmt: skip
        assert torch.equal(a, b), name


DISTRIBUTED_SCRIPT = """
import sys
import torch.distributed as dist
from safetensors.torch import save_file
sys.path.insert(0, {tests!r})
from tiny_models import tiny_qwen3
from training_support import run

dist.init_process_group("gloo")
model = tiny_qwen3()
run({out!r}, 4, model=model, batch_size=4, eval_every=4, checkpoint_every=4, **{options!r})
if dist.get_rank() == 0:
    save_file({{n: p.detach().contiguous() for n, p in model.named_parameters()}},
              {out!r} + "/model.safetensors")
dist.destroy_process_group()
"""


@pytest.mark.parametrize("options", [{}, DISTILL], ids=["scorer", "distill"])
def test_two_gloo_processes_match_one(tmp_path, options):
    model = tiny_qwen3()
    single = run(tmp_path / "single", 4, model=model, batch_size=4, eval_every=4,
                 checkpoint_every=4, **options)  # fmt: skip
    save_file({n: p.detach().contiguous() for n, p in model.named_parameters()},
              str(tmp_path / "single" / "model.safetensors"))  # fmt: skip
    script = tmp_path / "train.py"
    tests = str(Path(__file__).resolve().parents[1])
    pair = tmp_path / "pair"
    script.write_text(DISTRIBUTED_SCRIPT.format(tests=tests, out=str(pair), options=options))
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(script)], capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    one = load_file(single.scorer_path / "scorer.safetensors")
    two = load_file(pair / "scorer" / "scorer.safetensors")
    assert one.keys() == two.keys()
    for name in one:
        if name.endswith("readout.b2"):
            # The boundary loss sees only differences of priorities, so the output bias has a
            # zero gradient up to rounding; Adam scales that noise to lr-sized steps of either
            # sign. It shifts every priority of a head alike and changes no decision.
            continue
        # Gradients summed in another order, then 4 Adam steps: float32 rounding only.
        torch.testing.assert_close(two[name], one[name], rtol=1e-4, atol=1e-6)
    start = {n: p.detach() for n, p in tiny_qwen3().named_parameters()}
    one = load_file(tmp_path / "single" / "model.safetensors")
    two = load_file(pair / "model.safetensors")
    for name, initial in start.items():
        update_one, update_two = one[name] - initial, two[name] - initial
        if not options:
            assert torch.equal(update_two, update_one)  # scorer mode: the model stays frozen
            continue
        # The fine-tuned weights: Adam amplifies float32 rounding in its updates (elements
        # whose gradient changes sign between steps). Perturbing the starting weights by one
        # float32 rounding (1e-7 relative) moves this 4-step update by about 0.5%; a sharding
        # error (a lost shard, stale or unaveraged gradients) moves it by O(100%).
        drift = (update_two - update_one).norm() / update_one.norm().clamp(min=1e-12)
        assert drift <= 0.02 or update_one.norm() == update_two.norm() == 0, (name, drift)
