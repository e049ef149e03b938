"""``train_scorer``: learn a model's KVpop scorers from its own future attention.

The LLM is frozen and runs as the teacher: each decoder layer's attention is captured and
rewritten by the training passes (full attention that also yields each query's log-sum-exp,
the transposed-attention target, the scorer and its loss), so no N x N attention map is ever
built. Only scorer parameters get gradients; the LLM's activations are not kept for backward.

With ``mode="distill"`` the LLM is fine-tuned too (see :mod:`.objectives`).

Checkpoints (scorers, optimizer, step) are written atomically every ``checkpoint_every`` steps;
a run resumed from one gives the same scorers as an uninterrupted run. The trained scorers are
saved with the ``save_scorer`` format, ready for ``load_scorer`` on the transformed model.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from tqdm.auto import tqdm

from ..atomic import atomic_write
from ..config import KVpopConfig, require_int
from ..scorer_io import describe, save_scorers
from ..transform import check_transformable
from .data import Tokenizer, byte_tokenizer, pack, read_texts, split
from .distributed import ProcessGroup
from .objectives import DistillObjective, ScorerObjective
from .scorer_loss import LossKind

CHECKPOINT = "checkpoint.pt"
CHECKPOINT_FORMAT = "kvpop-train-checkpoint-v1"
MODES = ("scorer", "distill")


@dataclass
class TrainingReport:
    """What a run measured: per-step training loss/accuracy, held-out evaluations, output."""

    history: list[dict] = field(default_factory=list)
    evaluations: list[dict] = field(default_factory=list)
    scorer_path: Path | None = None


def _require_number(name: str, value: object, *, positive: bool) -> None:
    """Raise ``ValueError`` naming ``value`` unless it is a finite real number, ``> 0`` if
    ``positive`` else ``>= 0`` (a bool is not a number here)."""
    bound = "> 0" if positive else ">= 0"
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise ValueError(f"{name} must be a finite number {bound}, got {value!r}")


def _check_settings(
    config: KVpopConfig, seq_len: int, steps: int, batch_size: int, group: ProcessGroup,
    numbers: dict,
) -> None:  # fmt: skip
    if not config.scorer.learned:
        raise ValueError(
            f"scorer {config.scorer.value!r} has no parameters to train; choose memory or mlp"
        )
    for name, value in (("steps", steps), ("batch_size", batch_size), ("seq_len", seq_len)):
        require_int(name, value, 1)
    for name in ("eval_every", "checkpoint_every", "kl_top"):
        require_int(name, numbers[name], 1)
    require_int("seed", numbers["seed"], 0)
    for name in ("lr", "tau"):
        _require_number(name, numbers[name], positive=True)
    _require_number("kl_weight", numbers["kl_weight"], positive=False)
    if batch_size % group.world:
        raise ValueError(
            f"batch_size {batch_size} must be a multiple of the {group.world} processes"
        )
    if seq_len <= config.capacity:
        raise ValueError(
            f"seq_len {seq_len} must exceed the capacity {config.capacity} (sinks + window + "
            "topk): shorter sequences never make the policy choose what to drop"
        )


class _Batches:
    """Deterministic batches: a fresh seeded permutation of the training sequences per epoch,
    read as one stream, so step ``s`` always gets the same rows (resuming needs no RNG state)."""

    def __init__(self, count: int, batch_size: int, seed: int):
        self.count, self.batch_size, self.seed = count, batch_size, seed
        self._orders: dict[int, torch.Tensor] = {}

    def _order(self, epoch: int) -> torch.Tensor:
        if epoch not in self._orders:
            generator = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
            self._orders[epoch] = torch.randperm(self.count, generator=generator)
        return self._orders[epoch]

    def rows(self, step: int) -> torch.Tensor:
        first = step * self.batch_size
        items = range(first, first + self.batch_size)
        return torch.stack([self._order(i // self.count)[i % self.count] for i in items])


@torch.no_grad()
def _evaluate(objective, sequences: torch.Tensor, batch_size: int) -> dict:
    totals: dict[str, float] = {}
    batches = range(0, len(sequences), batch_size)
    for start in batches:
        _, metrics = objective(sequences[start : start + batch_size])
        for name, value in metrics.items():
            totals[name] = totals.get(name, 0.0) + float(value)
    return {name: total / len(batches) for name, total in totals.items()}


def _load_checkpoint(path: Path, settings: dict) -> dict | None:
    if not path.is_file():
        return None
    try:
        checkpoint = torch.load(path, weights_only=True)
    except Exception as error:  # a truncated or foreign file: say so, leave it in place
        raise ValueError(
            f"checkpoint {path} is corrupt ({type(error).__name__}); delete it or pass "
            "resume=False to start over"
        ) from None
    if not isinstance(checkpoint, dict) or checkpoint.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path} is not a kvpop_compile training checkpoint")
    if checkpoint["settings"] != settings:
        changed = sorted(k for k in settings if checkpoint["settings"].get(k) != settings[k])
        raise ValueError(
            f"checkpoint {path} was made with other settings ({', '.join(changed)}); use "
            "another output_dir or resume=False"
        )
    return checkpoint


def train_scorer(
    model: nn.Module,
    data,
    config: KVpopConfig,
    *,
    output_dir: str | os.PathLike,
    steps: int = 200,
    seq_len: int = 512,
    batch_size: int = 4,
    lr: float = 1e-3,
    loss: str = "boundary",
    tau: float = 1.0,
    mode: str = "scorer",
    trainable: Sequence[str] | None = None,
    kl_top: int = 32,
    kl_weight: float = 1.0,
    eval_fraction: float = 0.1,
    eval_every: int = 50,
    checkpoint_every: int = 50,
    seed: int = 0,
    tokenizer: Tokenizer | None = None,
    resume: bool = True,
    progress: bool = True,
) -> TrainingReport:
    """Train the scorers of ``config`` for an (untransformed) Qwen3 ``model`` on ``data``.

    ``data``: a folder of ``.txt``/``.py`` files, a ``.jsonl`` file, an Arrow dataset, or a
    list of texts (see :func:`~kvpop_compile.training.data.read_texts`),
    tokenized by ``tokenizer`` (text -> ids; UTF-8 bytes by default, for byte-vocabulary
    models) and packed into sequences of ``seq_len`` tokens. Writes ``checkpoint.pt`` and the
    final ``scorer/`` folder to ``output_dir``.

    ``mode="distill"`` also fine-tunes the model (the parameters whose names contain one of
    ``trainable``, or all): a copy runs under the running-top-k mask with KL to the frozen
    model's top ``kl_top`` logits weighted by ``kl_weight``, sharded with FSDP2 when several
    processes run; its weights are written into ``model`` at the end (save it with
    ``save_pretrained`` afterwards).
    """
    check_transformable(model, config)
    loss = LossKind(loss)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}; got {mode!r}")
    group = ProcessGroup.current()
    numbers = {
        "lr": lr, "tau": tau, "kl_top": kl_top, "kl_weight": kl_weight, "seed": seed,
        "eval_every": eval_every, "checkpoint_every": checkpoint_every,
    }  # fmt: skip
    _check_settings(config, seq_len, steps, batch_size, group, numbers)
    tokenizer = tokenizer or byte_tokenizer
    sequences = pack(read_texts(data), tokenizer, seq_len)
    train, held_out = split(sequences, eval_fraction)
    output = Path(output_dir)
    output.mkdir(parents=True, exist_ok=True)
    settings = {
        "kvpop_config": config.to_dict(),
        "seq_len": seq_len, "batch_size": batch_size, "lr": lr, "loss": loss.value, "tau": tau,
        "seed": seed, "train_sequences": len(train), "mode": mode,
        "trainable": None if trainable is None else list(trainable),
        "kl_top": kl_top, "kl_weight": kl_weight,
    }  # fmt: skip
    checkpoint = _load_checkpoint(output / CHECKPOINT, settings) if resume else None
    if mode == "distill":
        objective = DistillObjective(model, config, loss, tau, trainable=trainable,
                                     kl_top=kl_top, kl_weight=kl_weight, group=group)  # fmt: skip
    else:
        objective = ScorerObjective(model, config, loss, tau)

    frozen = {p: p.requires_grad for p in model.parameters()}
    was_training = model.training
    report = TrainingReport()
    try:
        with objective:
            scorers = objective.scorers
            parameters = objective.parameters()
            optimizer = torch.optim.AdamW(parameters, lr=lr)
            start = 0
            if checkpoint is not None:
                for scorer, state in zip(scorers, checkpoint["scorers"], strict=True):
                    scorer.load_state_dict(state)
                objective.load_extra_state(checkpoint["extra"])
                objective.load_optimizer_state(optimizer, checkpoint["optimizer"])
                start = checkpoint["step"]
                report.history = list(checkpoint["history"])
            batches = _Batches(len(train), batch_size, seed)
            show = progress and group.is_main
            bar = tqdm(range(start, steps), disable=not show, desc=f"train_scorer ({mode})")
            for step in bar:
                step_loss, metrics = objective(train[group.shard(batches.rows(step))])
                optimizer.zero_grad(set_to_none=True)
                step_loss.backward()
                group.average_gradients(objective.replicated_parameters())
                optimizer.step()
                record = {"step": step + 1}
                record.update({k: group.mean(v).item() for k, v in metrics.items()})
                report.history.append(record)
                bar.set_postfix(loss=f"{record['loss']:.4f}", acc=f"{record['accuracy']:.3f}")
                done = step + 1
                if done % eval_every == 0 or done == steps:
                    evaluation = _evaluate(objective, held_out, batch_size)
                    report.evaluations.append({"step": done, **evaluation})
                if done % checkpoint_every == 0 or done == steps:
                    # Every process gathers (sharded tensors need all); the main one writes.
                    state = {
                        "format": CHECKPOINT_FORMAT, "settings": settings, "step": done,
                        "scorers": [s.state_dict() for s in scorers],
                        "extra": objective.extra_state(),
                        "optimizer": objective.optimizer_state(optimizer),
                        "history": report.history,
                    }  # fmt: skip
                    if group.is_main:
                        atomic_write(output / CHECKPOINT, lambda tmp, s=state: torch.save(s, tmp))
            description = describe(
                config,
                num_layers=len(scorers),
                num_kv_heads=scorers[0].num_kv_heads,
                head_dim=scorers[0].head_dim,
            )
            report.scorer_path = output / "scorer"
            if group.is_main:
                save_scorers(scorers, description, report.scorer_path)
            group.barrier()  # the others return once the files are complete
    finally:
        for parameter, requires_grad in frozen.items():
            parameter.requires_grad_(requires_grad)
        model.train(was_training)
    return report
