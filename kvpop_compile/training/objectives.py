"""What scorer training optimises, and the per-layer graphs it runs.

``ScorerObjective`` (mode ``scorer``): the frozen LLM is its own teacher; each attention runs
the training graph (full attention, future-attention target, scorer loss). ``DistillObjective``
(mode ``distill``): the frozen LLM is the teacher; a copy of it is fine-tuned as a student
whose attention sees only what the running top-k keeps, with KL to the teacher's top logits,
plus the scorer loss; the tuned weights are written back into the LLM when training ends.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.fx import GraphModule

from ..capture import capture_attention
from ..config import KVpopConfig
from ..passes.remove_dead_code import remove_dead_code
from ..runtime.scorers.registry import build_scorer
from .distributed import ProcessGroup, assign_whole, shard_student, whole
from .passes import insert_future_attention_target, replace_attention_for_distillation
from .scorer_loss import LossKind, ScorerLoss


class GraphAttention(nn.Module):
    """A layer's attention running a training graph ``(hidden, cos, sin) -> (out, *extra)``.

    A teacher's graph returns the scorer's inputs as ``extra``; its ``scorer_loss`` turns them
    into the layer's loss and ranking accuracy, kept per call in ``records``."""

    def __init__(
        self, attention: nn.Module, graph: GraphModule, scorer_loss: ScorerLoss | None = None
    ):
        super().__init__()
        for name, child in attention.named_children():
            self.add_module(name, child)
        for name, child in graph.named_children():
            if name.startswith("kvpop_"):
                self.add_module(name, child)  # the student's attention and its scorer
        if scorer_loss is not None:
            self.kvpop_scorer_loss = scorer_loss  # the scorer, so it trains and moves with us
        self.__dict__["graph"] = graph  # its parameters are registered above
        self.records: list[tuple[torch.Tensor, torch.Tensor]] = []

    def forward(self, hidden_states, position_embeddings, attention_mask=None, **kwargs):
        batch = hidden_states.shape[0]
        cos, sin = (table.expand(batch, -1, -1) for table in position_embeddings)
        out, *extra = self.graph(hidden_states, cos, sin)
        if extra:
            self.records.append(self.kvpop_scorer_loss(*extra))
        return out, None


@contextlib.contextmanager
def swapped_attention(model: nn.Module, build: Callable[[int, nn.Module], GraphAttention]):
    """Swap ``build(layer_index, attention)`` into every layer; restore afterwards."""
    layers = model.model.layers
    originals = [layer.self_attn for layer in layers]
    try:
        swapped = []
        for index, (layer, attention) in enumerate(zip(layers, originals, strict=True)):
            layer.self_attn = build(index, attention)
            swapped.append(layer.self_attn)
        yield swapped
    finally:
        for layer, attention in zip(layers, originals, strict=True):
            layer.self_attn = attention


def _captured(model: nn.Module, attention: nn.Module) -> GraphModule:
    return capture_attention(
        attention, hidden_size=model.config.hidden_size, head_dim=attention.head_dim
    )


def teacher_attention(
    model: nn.Module,
    config: KVpopConfig,
    loss: LossKind,
    tau: float,
    target: str = "mean",
    power: float = 1.0,
):
    """Full attention plus, per layer, the future-attention target (``target``: the mean, max
    or power mean of ``power`` over later queries) and the scorer's loss, each at its layer's budget
    (``config.layer(i)``), as the transformed model keeps it."""
    config.check_layers(len(model.model.layers))

    def build(index, attention):
        layer_config = config.layer(index)
        captured = _captured(model, attention)
        captured.kvpop_target = target  # read by the pass
        captured.kvpop_target_power = power
        graph = insert_future_attention_target(captured, layer_config)
        layer = graph.kvpop_layer_idx  # seeds the layer's scorer, as transform does
        scorer = build_scorer(
            layer_config, model.config.num_key_value_heads, attention.head_dim, layer
        )
        scorer_loss = ScorerLoss(scorer, layer_config, loss, tau)
        return GraphAttention(attention, remove_dead_code(graph, layer_config), scorer_loss)

    return swapped_attention(model, build)


def student_attention(model: nn.Module, config: KVpopConfig, scorers: list):
    """Attention under the running-top-k mask of each layer's (shared) scorer, at the
    layer's budget."""
    config.check_layers(len(model.model.layers))

    def build(index, attention):
        layer_config = config.layer(index)
        graph = replace_attention_for_distillation(_captured(model, attention), layer_config)
        graph.kvpop_student_attention.scorer = scorers[index]
        return GraphAttention(attention, remove_dead_code(graph, layer_config))

    return swapped_attention(model, build)


def _scorer_loss(teachers) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean loss and ranking accuracy over the layers' records of one forward."""
    losses = torch.stack([loss for teacher in teachers for loss, _ in teacher.records])
    accuracies = torch.stack([acc for teacher in teachers for _, acc in teacher.records])
    return losses.mean(), accuracies.nanmean().detach()


def top_logit_kl(teacher: torch.Tensor, student: torch.Tensor, top: int) -> torch.Tensor:
    """KL(teacher || student) over the teacher's ``top`` most likely tokens, renormalised:
    ``teacher, student (B, N, vocab)`` logits. Mean over positions."""
    values, index = teacher.float().topk(min(top, teacher.shape[-1]), dim=-1)
    target = torch.log_softmax(values, dim=-1)
    student_log = torch.log_softmax(student.float(), dim=-1).gather(-1, index)
    student_log = student_log - torch.logsumexp(student_log, dim=-1, keepdim=True)
    return F.kl_div(student_log, target, log_target=True, reduction="none").sum(-1).mean()


class ScorerObjective:
    """Scorer-only training: the LLM is frozen and is its own teacher."""

    def __init__(
        self, model: nn.Module, config: KVpopConfig, loss: LossKind, tau: float,
        target: str = "mean", power: float = 1.0,
    ):  # fmt: skip
        self.model, self.config, self.loss, self.tau = model, config, loss, tau
        self.target, self.power = target, power
        self._stack = contextlib.ExitStack()

    def __enter__(self):
        self.model.eval().requires_grad_(False)
        self.teachers = self._stack.enter_context(
            teacher_attention(self.model, self.config, self.loss, self.tau, self.target, self.power)
        )
        self.scorers = [t.kvpop_scorer_loss.scorer for t in self.teachers]
        return self

    def __exit__(self, *error):
        return self._stack.__exit__(*error)

    def parameters(self) -> list[nn.Parameter]:
        return [p for s in self.scorers for p in s.parameters()]

    def replicated_parameters(self) -> list[nn.Parameter]:
        """Parameters every process holds whole, whose gradients the trainer averages."""
        return self.parameters()

    def extra_state(self) -> dict:
        """Trained tensors besides the scorers' (none: the LLM is frozen). Every process calls
        it (gathering a sharded tensor is a collective)."""
        return {}

    def load_extra_state(self, state: dict) -> None:
        pass

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict:
        """The optimizer's state for a checkpoint; every process calls it."""
        return optimizer.state_dict()

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict) -> None:
        optimizer.load_state_dict(state)

    def __call__(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, dict]:
        for teacher in self.teachers:
            teacher.records.clear()
        self.model.model(input_ids=input_ids, use_cache=False)
        loss, accuracy = _scorer_loss(self.teachers)
        return loss, {"loss": loss.detach(), "accuracy": accuracy}


class DistillObjective(ScorerObjective):
    """Fine-tune a copy of the LLM (the student) under the running-top-k mask with KL to the
    frozen LLM's top logits (the teacher), and train the scorers on the teacher's target. With
    several processes the student is sharded with FSDP2; the scorers stay replicated."""

    def __init__(self, model, config, loss, tau, *, trainable: Sequence[str] | None,
                 kl_top: int, kl_weight: float, group: ProcessGroup,
                 target: str = "mean", power: float = 1.0):  # fmt: skip
        super().__init__(model, config, loss, tau, target, power)
        self.trainable, self.kl_top, self.kl_weight = trainable, kl_top, kl_weight
        self.group = group

    def __enter__(self):
        self.student = copy.deepcopy(self.model)  # before the teacher's graphs are swapped in
        super().__enter__()
        self._stack.enter_context(student_attention(self.student, self.config, self.scorers))
        self.student.eval().requires_grad_(False)  # no dropout; gradients still flow
        scorer_parameters = set(super().parameters())
        names = [
            name for name, p in self.student.named_parameters()
            if p not in scorer_parameters
            and (self.trainable is None or any(part in name for part in self.trainable))
        ]  # fmt: skip
        if not names:
            raise ValueError(f"no model parameter name contains any of {list(self.trainable)}")
        self.sharded = self.group.world > 1
        if self.sharded:
            shard_student(self.student, self.group, keep_whole=scorer_parameters)
        parameters = dict(self.student.named_parameters())  # FSDP2 made new parameter objects
        self.tuned = {name: parameters[name] for name in names}
        for parameter in (*scorer_parameters, *self.tuned.values()):
            parameter.requires_grad_(True)
        return self

    def __exit__(self, error_type, *error):
        if error_type is None:  # a run that failed leaves the model as it was
            with torch.no_grad():
                model = dict(self.model.named_parameters())
                for name, parameter in self.tuned.items():
                    model[name].copy_(whole(parameter.detach()))
        return super().__exit__(error_type, *error)

    def parameters(self) -> list[nn.Parameter]:
        return [*super().parameters(), *self.tuned.values()]

    def replicated_parameters(self) -> list[nn.Parameter]:
        # FSDP2 reduces the sharded student's gradients itself.
        return super().parameters() if self.sharded else self.parameters()

    def extra_state(self) -> dict:
        return {name: whole(p.detach()).clone() for name, p in self.tuned.items()}

    def load_extra_state(self, state: dict) -> None:
        with torch.no_grad():
            for name, tensor in state.items():
                assign_whole(self.tuned[name], tensor)

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict:
        """Keyed by parameter name and gathered whole, so a run resumes under any number of
        processes."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True)
        return get_optimizer_state_dict(self.student, optimizer, options=options)

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict) -> None:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True)
        set_optimizer_state_dict(self.student, optimizer, state, options=options)

    def __call__(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, dict]:
        for teacher in self.teachers:
            teacher.records.clear()
        # Not under no_grad: the scorers' loss is computed inside the teacher's forward. The
        # teacher's own weights are frozen, so its activations are not kept.
        teacher_logits = self.model(input_ids=input_ids, use_cache=False).logits
        scorer_loss, accuracy = _scorer_loss(self.teachers)
        student_logits = self.student(input_ids=input_ids, use_cache=False).logits
        kl = top_logit_kl(teacher_logits.detach(), student_logits, self.kl_top)
        loss = scorer_loss + self.kl_weight * kl
        metrics = {"loss": loss.detach(), "accuracy": accuracy, "kl": kl.detach()}
        return loss, metrics
