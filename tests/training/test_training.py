"""Scorer training: the training-graph pass, train_scorer, checkpoints and resume."""

import dataclasses
import math

import pytest
import torch
from tiny_models import prompt, tiny_qwen3
from torch.fx import Interpreter
from training_support import CONFIG, TEXTS, run

import kvpop_compile as kc
from kvpop_compile.capture import capture_attention
from kvpop_compile.runtime import (
    BoundaryDecisions,
    build_scorer,
    future_attention_target_dense,
    masked_attention,
)
from kvpop_compile.scorer_io import tensors_sha256
from kvpop_compile.training import train_scorer
from kvpop_compile.training.losses import boundary_decisions, boundary_loss
from kvpop_compile.training.passes import insert_future_attention_target
from kvpop_compile.training.scorer_loss import ScorerLoss


def training_graph(model, layer=0, target=None, power=None):
    attention = model.model.layers[layer].self_attn
    graph = capture_attention(
        attention, hidden_size=model.config.hidden_size, head_dim=attention.head_dim
    )
    if target is not None:
        graph.kvpop_target = target  # as ScorerObjective sets it
    if power is not None:
        graph.kvpop_target_power = power
    return attention, insert_future_attention_target(graph, CONFIG)


def test_pass_inserts_one_target_per_attention():
    _, gm = training_graph(tiny_qwen3())
    targets = [str(node.target) for node in gm.graph.nodes]
    assert targets.count("kvpop.masked_attention.default") == 1
    assert targets.count("kvpop.future_attention_target.default") == 1
    assert "aten.scaled_dot_product_attention.default" not in targets
    output = next(node for node in gm.graph.nodes if node.op == "output")
    # Attention output, then the scorer loss's inputs: pre-RoPE keys, values, target, validity.
    assert len(output.args[0]) == 5


class ShapeRecorder(Interpreter):
    def run_node(self, node):
        result = super().run_node(node)
        self.shapes.extend(
            tuple(t.shape) for t in torch.utils._pytree.tree_leaves(result)
            if isinstance(t, torch.Tensor)
        )  # fmt: skip
        return result


def test_training_graph_never_holds_an_n_by_n_tensor():
    model = tiny_qwen3()
    _, gm = training_graph(model)
    n = 512
    hidden = torch.randn(1, n, model.config.hidden_size)
    cos, sin = model.model.rotary_emb(hidden, torch.arange(n)[None])
    recorder = ShapeRecorder(gm)
    recorder.shapes = []
    with torch.no_grad():
        recorder.run(hidden, cos, sin)
    assert recorder.shapes
    assert all(sum(size >= n for size in shape) < 2 for shape in recorder.shapes)
    # Inside the ops: the teacher attention's scratch is O(block * N), never N x N.
    q, k = torch.randn(1, 4, 8192, 16), torch.randn(1, 2, 8192, 16)
    largest = []

    class Largest(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            largest.extend(t.numel() for t in torch.utils._pytree.tree_leaves(out)
                           if isinstance(t, torch.Tensor))  # fmt: skip
            return out

    with Largest():
        masked_attention(q, k, k, None, scale=0.25, block=64)
    assert max(largest) <= 4 * 64 * 8192


@pytest.mark.parametrize("loss_kind", ["boundary", "gap"])
@pytest.mark.parametrize(("tau", "lam"), [(1.0, 0.0), (3.0, 0.05)])
def test_loss_equals_a_hand_written_step_on_the_dense_reference(loss_kind, tau, lam):
    """The layer's loss at the run's temperature ``tau`` and decay ``lam`` (priorities
    ``r_t + lam * t`` for the scorer's scores and for the target's, in the decisions and the
    gap weights alike)."""
    config = dataclasses.replace(CONFIG, lam=lam)
    model = tiny_qwen3()
    attention, gm = training_graph(model)
    n = 64
    hidden = torch.randn(2, n, model.config.hidden_size)
    cos, sin = model.model.rotary_emb(hidden, torch.arange(n)[None].expand(2, -1))
    kv_heads = model.config.num_key_value_heads
    scorer = build_scorer(config, kv_heads, attention.head_dim, gm.kvpop_layer_idx)
    scorer_loss = ScorerLoss(scorer, config, loss_kind, tau=tau)
    with torch.no_grad():
        _, *scorer_inputs = gm(hidden, cos, sin)
        loss, accuracy = scorer_loss(*scorer_inputs)
        shape = (2, n, -1, attention.head_dim)
        q = attention.q_norm(attention.q_proj(hidden).view(shape)).transpose(1, 2)
        raw_k = attention.k_norm(attention.k_proj(hidden).view(shape)).transpose(1, 2)
        v = attention.v_proj(hidden).view(shape).transpose(1, 2)
        from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb

        q, k = apply_rotary_pos_emb(q, raw_k, cos, sin)
        target, _ = future_attention_target_dense(
            q, k, window=CONFIG.window, scale=attention.scaling
        )
        rhat, _ = scorer.score_sequence(raw_k, v, CONFIG.window)
        decay = lam * torch.arange(n)
        decisions = boundary_decisions(target, sinks=2, window=8, topk=16, lam=lam)
        weights = target + decay if loss_kind == "gap" else None
        expected = boundary_loss(rhat + decay, decisions, tau=tau, target_priority=weights)
        undecayed = boundary_decisions(target, sinks=2, window=8, topk=16, lam=0.0)
    assert torch.equal(decisions.keep, undecayed.keep) == (lam == 0)  # the decay decides
    # Same float32 values by two routes (dense vs transposed target: ~1e-6 apart in log space).
    torch.testing.assert_close(loss, expected, rtol=1e-4, atol=1e-5)
    assert 0 <= float(accuracy) <= 1


@pytest.mark.parametrize("tau", [0.5, 3.0])
def test_boundary_loss_divides_the_margin_by_tau(tau):
    """Hand-built decisions over 4 queries, two of them valid: at query 2 the new token 2
    (priority -0.5) enters over the boundary token 1 (1.0), at query 3 the new token 3 (2.0)
    is dropped against token 0 (0.0). The loss is the mean of ``softplus(-y * margin / tau)``,
    and weighted by the target gaps (3 and 1) with ``target_priority``."""
    pred = torch.tensor([[0.0, 1.0, -0.5, 2.0]])
    decisions = BoundaryDecisions(
        new=torch.tensor([[0, 0, 2, 3]]),
        boundary=torch.tensor([[0, 0, 1, 0]]),
        keep=torch.tensor([[False, False, True, False]]),
        valid=torch.tensor([[False, False, True, True]]),
    )
    softplus = lambda x: math.log1p(math.exp(x))  # noqa: E731
    enters, dropped = softplus(1.5 / tau), softplus(2.0 / tau)  # -y * margin = 1.5 and 2
    loss = boundary_loss(pred, decisions, tau=tau)
    torch.testing.assert_close(loss, torch.tensor((enters + dropped) / 2))
    target = torch.tensor([[1.0, 4.0, 1.0, 2.0]])  # gaps |1 - 4| = 3 and |2 - 1| = 1
    weighted = boundary_loss(pred, decisions, tau=tau, target_priority=target)
    torch.testing.assert_close(weighted, torch.tensor((3 * enters + 1 * dropped) / 4))


@pytest.mark.parametrize(
    ("target", "power"), [("mean", 1.0), ("max", 1.0), ("power_mean", 3.0), ("power_mean", 6.0)]
)
def test_the_graphs_target_is_the_dense_one_the_settings_name(target, power):
    """The pass computes the target the run asks for: checked against the dense reference on
    the graph's own queries and keys, and the targets differ."""
    model = tiny_qwen3()
    attention, gm = training_graph(model, target=target, power=power)
    n = 48
    hidden = torch.randn(1, n, model.config.hidden_size)
    cos, sin = model.model.rotary_emb(hidden, torch.arange(n)[None])
    with torch.no_grad():
        _, _, _, log_target, valid = gm(hidden, cos, sin)
        shape = (1, n, -1, attention.head_dim)
        q = attention.q_norm(attention.q_proj(hidden).view(shape)).transpose(1, 2)
        k = attention.k_norm(attention.k_proj(hidden).view(shape)).transpose(1, 2)
        from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb

        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        dense = {
            (kind, a): future_attention_target_dense(
                q, k, window=CONFIG.window, scale=attention.scaling, aggregate=kind, power=a
            )[0]
            for kind, a in [("mean", 1.0), ("max", 1.0), ("power_mean", 3.0), ("power_mean", 6.0)]
        }
    torch.testing.assert_close(log_target[..., valid], dense[target, power][..., valid],
                               rtol=0, atol=2e-5)  # fmt: skip
    for other in dense.keys() - {(target, power)}:
        assert (dense[other] - dense[target, power])[..., valid].abs().max() > 0.05, other


def test_a_run_records_its_target_and_refuses_an_unknown_one(tmp_path):
    run(tmp_path, 3, target="max")
    checkpoint = torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    assert checkpoint["settings"]["target"] == "max"  # a resume with the mean is refused
    assert "target_power" not in checkpoint["settings"]
    with pytest.raises(ValueError, match="target must be one of mean, max, power_mean; got 'sum'"):
        kc.TrainSettings(target="sum")


def test_a_power_mean_run_records_its_power_and_a_resume_at_another_is_refused(tmp_path):
    run(tmp_path, 2, target="power_mean", target_power=3.0)
    checkpoint = torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    assert checkpoint["settings"]["target"] == "power_mean"
    assert checkpoint["settings"]["target_power"] == 3.0
    with pytest.raises(ValueError, match="target_power"):
        run(tmp_path, 4, target="power_mean", target_power=5.0)


@pytest.mark.parametrize(
    ("target", "power", "message"),
    [
        ("power_mean", None, r"target_power must be a number in \(1, 1000\] for target "
         r"'power_mean' \(1 is the mean; for more, the max\), got None"),
        ("power_mean", 1.0, r"in \(1, 1000\] .*got 1.0$"),
        ("power_mean", 1e4, r"in \(1, 1000\] .*got 10000.0$"),
        ("power_mean", float("inf"), r"in \(1, 1000\] .*got inf$"),
        ("power_mean", True, r"in \(1, 1000\] .*got True$"),
        ("max", 2.0, "target_power applies to target 'power_mean' only; got target_power 2.0"),
        ("mean", 3, "target_power applies to target 'power_mean' only; got target_power 3"),
    ],
)  # fmt: skip
def test_a_target_power_that_does_not_fit_the_target_is_refused(target, power, message):
    with pytest.raises(ValueError, match=message):
        kc.TrainSettings(target=target, target_power=power)


def test_training_lowers_the_loss_and_ranks_above_chance(tmp_path):
    report = run(tmp_path, 30)
    first = sum(r["loss"] for r in report.history[:5]) / 5
    last = sum(r["loss"] for r in report.history[-5:]) / 5
    assert last < first
    assert report.evaluations[-1]["accuracy"] > 0.6  # chance is 0.5
    model = kc.transform(tiny_qwen3(), CONFIG)
    kc.load_scorer(model, report.scorer_path)
    assert kc.generate(model, prompt(length=40, batch=1), 5).shape == (1, 45)


def test_resumed_run_equals_an_uninterrupted_one(tmp_path):
    straight = run(tmp_path / "straight", 6)
    run(tmp_path / "resumed", 3)
    resumed = run(tmp_path / "resumed", 6)
    assert resumed.history == straight.history
    a = (straight.scorer_path / "scorer.safetensors").read_bytes()
    b = (resumed.scorer_path / "scorer.safetensors").read_bytes()
    assert a == b


def test_bad_inputs_are_refused_and_checkpoints_kept(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no .txt or .py files in"):
        train_scorer(tiny_qwen3(), tmp_path / "empty", CONFIG, output_dir=tmp_path / "a")
    with pytest.raises(ValueError, match="seq_len 20 must exceed the capacity 26"):
        run(tmp_path / "b", 2, seq_len=20)
    with pytest.raises(ValueError, match="scorer 'window' has no parameters to train"):
        train_scorer(tiny_qwen3(), TEXTS, kc.KVpopConfig(sinks=2, window=8, topk=16,
                     scorer="window"), output_dir=tmp_path / "c", progress=False)  # fmt: skip
    with pytest.raises(ValueError, match="already transformed"):
        train_scorer(kc.transform(tiny_qwen3(), CONFIG), TEXTS, CONFIG, output_dir=tmp_path / "d")
    run(tmp_path / "e", 3)
    checkpoint = tmp_path / "e" / "checkpoint.pt"
    checkpoint.write_bytes(checkpoint.read_bytes()[:100])
    damaged = checkpoint.read_bytes()
    with pytest.raises(ValueError, match="checkpoint .* is corrupt"):
        run(tmp_path / "e", 6)
    assert checkpoint.read_bytes() == damaged  # left for the user to inspect
    run(tmp_path / "f", 3)
    with pytest.raises(ValueError, match="made with other settings \\(lr\\)"):
        run(tmp_path / "f", 6, lr=1e-2)


def test_cli_trains_a_local_checkpoint(tmp_path, capsys):
    from kvpop_compile.cli import main

    tiny_qwen3().save_pretrained(tmp_path / "checkpoint")
    (tmp_path / "data").mkdir()
    for i, text in enumerate(TEXTS):
        (tmp_path / "data" / f"{i}.py").write_text(text)
    args = ["train", "--model", str(tmp_path / "checkpoint"), "--data", str(tmp_path / "data"),
            "--out", str(tmp_path / "out"), "--sinks", "2", "--window", "8", "--topk", "16",
            "--steps", "4", "--seq-len", "96", "--batch-size", "2", "--eval-every", "2",
            "--tokenizer", "bytes"]  # fmt: skip
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "step 4: held-out loss" in out and "wrote scorer to" in out
    assert (tmp_path / "out" / "scorer" / "scorer.json").is_file()
    # --init-from: a second run starts from the first one's scorer (recorded by its digest).
    again = [
        *args[: args.index("--out") + 1],
        str(tmp_path / "again"),
        *args[args.index("--out") + 2 :],
    ]
    assert main([*again, "--init-from", str(tmp_path / "out" / "scorer")]) == 0
    checkpoint = torch.load(tmp_path / "again" / "checkpoint.pt", weights_only=False)
    assert checkpoint["settings"]["init_from_sha256"] == tensors_sha256(tmp_path / "out" / "scorer")
    assert main([*again, "--init-from", str(tmp_path)]) == 2  # not a scorer folder: one line
    assert "not a saved KVpop scorer folder" in capsys.readouterr().err
