"""``train_scorer``: learn a model's KVpop scorers from its own future attention.

The LLM is frozen and runs as the teacher: each decoder layer's attention is captured and
rewritten by the training passes (full attention that also yields each query's log-sum-exp,
the transposed-attention target, the scorer and its loss), so no N x N attention map is ever
built. Only scorer parameters get gradients; the LLM's activations are not kept for backward.

With ``mode="distill"`` the LLM is fine-tuned too (see :mod:`.objectives`).

With ``select`` (a measure of a saved scorer folder, higher is better) the run keeps the best
of its candidates, measured at the start and at every evaluation, instead of its last step
(:mod:`.selection`). ``TrainSettings.init_from`` starts the scorers from a saved scorer
(:mod:`.warm_start`).

Checkpoints (scorers, optimizer, step) are written atomically every ``checkpoint_every`` steps
(:class:`~.settings.TrainSettings`); a run resumed from one gives the same scorers as an
uninterrupted run. The trained scorers are saved with the ``save_scorer`` format, ready for
``load_scorer`` on the transformed model.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from tqdm.auto import tqdm

from ..atomic import atomic_write
from ..config import KVpopConfig
from ..scorer_io import describe, save_scorers, tensors_sha256
from ..transform import check_transformable
from .data import Tokenizer, byte_tokenizer, pack, read_texts, split
from .distributed import ProcessGroup
from .objectives import DistillObjective, ScorerObjective
from .recall_data import recall_sequences
from .selection import CandidateSelection
from .settings import TrainMode, TrainSettings
from .warm_start import check_start, warm_start

CHECKPOINT = "checkpoint.pt"
CHECKPOINT_FORMAT = "kvpop-train-checkpoint-v1"


@dataclass
class TrainingReport:
    """What a run measured: per-step training loss/accuracy, held-out evaluations, output;
    with a ``select`` measure, each candidate's measure and the step whose scorer was saved."""

    history: list[dict] = field(default_factory=list)
    evaluations: list[dict] = field(default_factory=list)
    scorer_path: Path | None = None
    selections: list[dict] = field(default_factory=list)
    selected_step: int | None = None


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


class CheckpointError(ValueError):
    """A checkpoint in the output folder that a resumed run cannot continue: the file ``path``
    and what is wrong with it (``problem``, a phrase that follows the path), so a front end can
    say what its own users should do; the message says it for callers of :func:`train_scorer`."""

    def __init__(self, message: str, *, path: Path, problem: str):
        super().__init__(message)
        self.path, self.problem = path, problem


def _load_checkpoint(path: Path, recorded: dict) -> dict | None:
    if not path.is_file():
        return None
    try:
        checkpoint = torch.load(path, weights_only=True)
    except Exception as error:  # a truncated or foreign file: say so, leave it in place
        raise CheckpointError(
            f"checkpoint {path} is corrupt ({type(error).__name__}); delete it or pass "
            "resume=False to start over",
            path=path, problem=f"is a corrupt checkpoint ({type(error).__name__})",
        ) from None  # fmt: skip
    if not isinstance(checkpoint, dict) or checkpoint.get("format") != CHECKPOINT_FORMAT:
        problem = "is not a kvpop_compile training checkpoint"
        raise CheckpointError(f"{path} {problem}", path=path, problem=problem)
    if checkpoint["settings"] != recorded:  # a key set on one side only counts as changed
        saved = checkpoint["settings"]
        names = sorted(k for k in {*saved, *recorded} if saved.get(k) != recorded.get(k))
        changed = ", ".join(names)
        raise CheckpointError(
            f"checkpoint {path} was made with other settings ({changed}); use "
            "another output_dir or resume=False",
            path=path, problem=f"is a checkpoint made with other settings ({changed})",
        )  # fmt: skip
    return checkpoint


def train_scorer(
    model: nn.Module,
    data,
    config: KVpopConfig,
    settings: TrainSettings | None = None,
    *,
    output_dir: str | os.PathLike,
    tokenizer: Tokenizer | None = None,
    progress: bool = True,
    select: Callable[[Path], float] | None = None,
) -> TrainingReport:
    """Train the scorers of ``config`` for an (untransformed) Qwen3 ``model`` on ``data``, as
    ``settings`` say (:class:`TrainSettings`; its defaults if ``None``).

    ``data``: a folder of ``.txt``/``.py`` files, a ``.jsonl`` file, an Arrow dataset, or a
    list of texts (see :func:`~kvpop_compile.training.data.read_texts`),
    tokenized by ``tokenizer`` (text -> ids; UTF-8 bytes by default, for byte-vocabulary
    models) and packed into sequences of ``settings.seq_len`` tokens. Writes ``checkpoint.pt``
    and the final ``scorer/`` folder to ``output_dir``; ``progress`` shows a progress bar.

    ``select(folder) -> float``, if given, measures a candidate scorer saved in ``folder`` (for
    example the accuracy of a task's answers with it loaded); the saved ``scorer/`` is then the
    best candidate, measured at step 0 and at every evaluation, not the last step's.

    In ``distill`` mode the model is fine-tuned too: a copy runs under the running-top-k mask,
    sharded with FSDP2 when several processes run; its weights are written into ``model`` at
    the end (save it with ``save_pretrained`` afterwards).
    """
    settings = _settings(settings)
    check_transformable(model, config)
    group = ProcessGroup.current()
    settings.check_for(config, group.world)
    if select is not None and settings.mode is TrainMode.DISTILL:
        # A candidate is a scorer folder; the distilled model's weights would stay the last
        # step's, paired with another step's scorers.
        raise ValueError(
            "select keeps one of the run's scorer candidates, which holds only scorers; it "
            "works with mode='scorer', not 'distill' (the model trains too)"
        )
    if settings.init_from is not None:
        check_start(settings.init_from, config.scorer)  # before the data is read
    texts = read_texts(data)
    sequences = pack(texts, tokenizer or byte_tokenizer, settings.seq_len)
    train, held_out = split(sequences, settings.eval_fraction)
    if settings.recall_fraction:
        fraction = settings.recall_fraction
        count = round(len(train) * fraction / (1 - fraction))
        items = recall_sequences(texts, train, tokenizer or byte_tokenizer, count, settings.seed)
        train = torch.cat([train, items])
    output = Path(output_dir)
    output.mkdir(parents=True, exist_ok=True)
    selection = None if select is None else CandidateSelection(select, output)
    recorded = settings.recorded(config, len(train))
    if settings.init_from is not None:  # by content: the same scorer under any path
        recorded["init_from_sha256"] = tensors_sha256(settings.init_from)
    if select is not None:
        # Part of the run: a resume that dropped it would overwrite the measures taken, one
        # that added it would choose among steps never measured. Recorded only when set, so
        # checkpoints made before it existed still resume.
        recorded["select"] = True
    checkpoint = _load_checkpoint(output / CHECKPOINT, recorded) if settings.resume else None
    if settings.mode is TrainMode.DISTILL:
        objective = DistillObjective(
            model, config, settings.loss, settings.tau, trainable=settings.trainable,
            kl_top=settings.kl_top, kl_weight=settings.kl_weight, group=group,
            target=settings.target.value, power=settings.aggregate_power,
        )  # fmt: skip
    else:
        objective = ScorerObjective(model, config, settings.loss, settings.tau,
                                    settings.target.value, settings.aggregate_power)  # fmt: skip

    frozen = {p: p.requires_grad for p in model.parameters()}
    was_training = model.training
    report = TrainingReport()
    try:
        with objective:
            scorers = objective.scorers
            parameters = objective.parameters()
            optimizer = torch.optim.AdamW(parameters, lr=settings.lr)
            start = 0
            if checkpoint is None and settings.init_from is not None:
                warm_start(scorers, config.scorer, settings.init_from)
            if checkpoint is not None:
                for scorer, state in zip(scorers, checkpoint["scorers"], strict=True):
                    scorer.load_state_dict(state)
                objective.load_extra_state(checkpoint["extra"])
                objective.load_optimizer_state(optimizer, checkpoint["optimizer"])
                start = checkpoint["step"]
                report.history = list(checkpoint["history"])
                report.evaluations = list(checkpoint.get("evaluations", []))
                if selection is not None:
                    selection.measured = list(checkpoint.get("selections", []))
            description = describe(
                config,
                num_layers=len(scorers),
                num_kv_heads=scorers[0].num_kv_heads,
                head_dim=scorers[0].head_dim,
            )
            if selection is not None and start == 0:
                selection.measure(0, scorers, description, group)
            batches = _Batches(len(train), settings.batch_size, settings.seed)
            show = progress and group.is_main
            bar = tqdm(
                range(start, settings.steps), disable=not show,
                desc=f"train_scorer ({settings.mode.value})",
            )  # fmt: skip
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
                if done % settings.eval_every == 0 or done == settings.steps:
                    evaluation = _evaluate(objective, held_out, settings.batch_size)
                    report.evaluations.append({"step": done, **evaluation})
                    if selection is not None:
                        selection.measure(done, scorers, description, group)
                if done % settings.checkpoint_every == 0 or done == settings.steps:
                    # Every process gathers (sharded tensors need all); the main one writes.
                    state = {
                        "format": CHECKPOINT_FORMAT, "settings": recorded, "step": done,
                        "scorers": [s.state_dict() for s in scorers],
                        "extra": objective.extra_state(),
                        "optimizer": objective.optimizer_state(optimizer),
                        "history": report.history, "evaluations": report.evaluations,
                        "selections": [] if selection is None else selection.measured,
                    }  # fmt: skip
                    if group.is_main:
                        atomic_write(output / CHECKPOINT, lambda tmp, s=state: torch.save(s, tmp))
            if selection is not None:
                report.selected_step = selection.best_step()
                report.selections = list(selection.measured)
                if group.is_main:  # it alone saves; the candidates are where it wrote them
                    selection.load_best(scorers)
            report.scorer_path = output / "scorer"
            if group.is_main:
                save_scorers(scorers, description, report.scorer_path)
            group.barrier()  # the others return once the files are complete
    finally:
        for parameter, requires_grad in frozen.items():
            parameter.requires_grad_(requires_grad)
        model.train(was_training)
    return report


def _settings(settings: TrainSettings | None) -> TrainSettings:
    """``settings``, or the defaults when ``None``."""
    if settings is None:
        return TrainSettings()
    if not isinstance(settings, TrainSettings):
        raise TypeError(f"settings must be a TrainSettings or None, got {type(settings).__name__}")
    return settings
