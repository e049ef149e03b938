"""``TrainSettings``: how :func:`~kvpop_compile.training.train_scorer` trains, checked when made,
as :class:`~kvpop_compile.KVpopConfig` checks the budget."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from ..config import KVpopConfig, require_choice, require_int, require_number
from ..runtime.reference.future_attention_target import check_power
from .scorer_loss import LossKind


class TargetKind(str, Enum):
    """How the future-attention target reduces the attention a token receives from the queries
    after it has left the window
    (:mod:`kvpop_compile.runtime.reference.future_attention_target`)."""

    MEAN = "mean"  # the mean over those queries (design.md §4)
    MAX = "max"  # the strongest one: what a single later question needs ranks high
    # (mean of p ** a) ** (1 / a), a = ``target_power`` > 1: between the two
    POWER_MEAN = "power_mean"


class TrainMode(str, Enum):
    """What trains: the scorers alone, or the LLM too."""

    SCORER = "scorer"  # the LLM frozen and its own teacher; only the scorers train (cheap)
    DISTILL = "distill"  # the LLM fine-tuned too, under the running-top-k mask (design.md §4)


@dataclass(frozen=True)
class TrainSettings:
    """The settings of one scorer-training run.

    ``steps`` optimizer steps of ``batch_size`` sequences of ``seq_len`` tokens, AdamW at
    ``lr``, on the ``loss`` (``tau``: the boundary loss's temperature) against the ``target``
    (the mean, the max or the power mean of power ``target_power`` of the attention each token
    receives later; ``target_power`` is set for the power mean only). The last
    ``eval_fraction`` of the sequences is held out and evaluated every ``eval_every`` steps; a
    checkpoint is written every ``checkpoint_every`` steps and, with ``resume``, continued.
    ``seed`` orders the batches. ``recall_fraction``: that share of the training sequences are
    recall items planted in the data's own text (:mod:`.recall_data`), beside its plain
    sequences; the held-out ones stay plain. ``mode="distill"`` also fine-tunes the parameters
    whose names contain one of ``trainable`` (all if ``None``) with KL to the frozen model's
    top ``kl_top`` logits, weighted by ``kl_weight``. ``init_from``: a saved scorer folder the
    scorers start from instead of a random draw (the same kind, or an ``mlp`` scorer for a
    ``memory`` one: :mod:`.warm_start`).
    """

    steps: int = 200
    seq_len: int = 512
    batch_size: int = 4
    lr: float = 1e-3
    loss: LossKind | str = LossKind.BOUNDARY
    tau: float = 1.0
    target: TargetKind | str = TargetKind.MEAN
    target_power: float | None = None
    mode: TrainMode | str = TrainMode.SCORER
    trainable: Sequence[str] | None = None
    kl_top: int = 32
    kl_weight: float = 1.0
    eval_fraction: float = 0.1
    eval_every: int = 50
    checkpoint_every: int = 50
    seed: int = 0
    resume: bool = True
    init_from: str | os.PathLike | None = None
    recall_fraction: float = 0.0

    def __post_init__(self) -> None:
        for name in ("steps", "seq_len", "batch_size", "eval_every", "checkpoint_every", "kl_top"):
            require_int(name, getattr(self, name), 1)
        require_int("seed", self.seed, 0)
        require_number("lr", self.lr, positive=True)
        require_number("tau", self.tau, positive=True)
        require_number("kl_weight", self.kl_weight, positive=False)
        fraction = self.eval_fraction
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)):
            raise ValueError(f"eval_fraction must be a number in (0, 1), got {fraction!r}")
        if not 0 < fraction < 1:
            raise ValueError(f"eval_fraction must be in (0, 1), got {fraction}")
        fraction = self.recall_fraction
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)):
            raise ValueError(f"recall_fraction must be a number in [0, 1), got {fraction!r}")
        if not 0 <= fraction < 1:
            raise ValueError(f"recall_fraction must be in [0, 1), got {fraction}")
        if not isinstance(self.resume, bool):
            raise ValueError(f"resume must be True or False, got {self.resume!r}")
        if self.init_from is not None:
            if not isinstance(self.init_from, (str, os.PathLike)):
                raise ValueError(
                    f"init_from must be a saved scorer folder (str or path) or None, got "
                    f"{self.init_from!r}"
                )
            object.__setattr__(self, "init_from", os.fspath(self.init_from))
        trainable = self.trainable
        if trainable is not None:
            if isinstance(trainable, str) or not all(isinstance(t, str) for t in trainable):
                raise ValueError(
                    f"trainable must be a list of parameter-name parts or None, got {trainable!r}"
                )
            object.__setattr__(self, "trainable", tuple(trainable))
        object.__setattr__(self, "loss", require_choice("loss", self.loss, LossKind))
        object.__setattr__(self, "mode", require_choice("mode", self.mode, TrainMode))
        object.__setattr__(self, "target", require_choice("target", self.target, TargetKind))
        if self.target is TargetKind.POWER_MEAN:
            power = check_power("target_power", self.target_power, "target 'power_mean'")
            object.__setattr__(self, "target_power", power)
        elif self.target_power is not None:
            raise ValueError(
                f"target_power applies to target 'power_mean' only; got target_power "
                f"{self.target_power!r} with target {self.target.value!r}"
            )

    @property
    def aggregate_power(self) -> float:
        """The power the target's aggregate takes (1 unless the target is the power mean)."""
        return 1.0 if self.target_power is None else self.target_power

    def check_for(self, config: KVpopConfig, processes: int) -> None:
        """Raise unless these settings can train ``config``'s scorers on ``processes``."""
        if not config.scorer.learned:
            raise ValueError(
                f"scorer {config.scorer.value!r} has no parameters to train; choose memory or mlp"
            )
        if self.batch_size % processes:
            raise ValueError(
                f"batch_size {self.batch_size} must be a multiple of the {processes} processes"
            )
        if self.seq_len <= config.max_capacity:
            raise ValueError(
                f"seq_len {self.seq_len} must exceed the capacity {config.max_capacity} (sinks "
                "+ window + topk, the largest layer's): shorter sequences never make that "
                "layer's policy choose what to drop"
            )

    def recorded(self, config: KVpopConfig, train_sequences: int) -> dict:
        """What a checkpoint records of the run, and a resumed run must match (the recall
        fraction and the target's power only when set, so that checkpoints of runs before they
        existed still resume)."""
        recall = {"recall_fraction": self.recall_fraction} if self.recall_fraction else {}
        if self.target_power is not None:
            recall["target_power"] = self.target_power
        return recall | {
            "kvpop_config": config.to_dict(),
            "seq_len": self.seq_len, "batch_size": self.batch_size, "lr": self.lr,
            "loss": self.loss.value, "tau": self.tau, "target": self.target.value,
            "seed": self.seed,
            "train_sequences": train_sequences, "mode": self.mode.value,
            "trainable": None if self.trainable is None else list(self.trainable),
            "kl_top": self.kl_top, "kl_weight": self.kl_weight,
        }  # fmt: skip
