"""The training loop: learning rate schedule, progress counts and atomic checkpoints."""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch

from kvpop_compile.atomic import atomic_write

from .data_mix import COPY_LEN, LONG_LEN, SHORT_LEN, RecallMix, copy_batch, sample_batch
from .progress import Progress


def learning_rate(progress: float, args: argparse.Namespace) -> float:
    """Linear warmup to ``args.lr``, then cosine decay to ``lr * min_lr_ratio``."""
    if progress < args.warmup:
        return args.lr * max(progress, 1e-3) / args.warmup
    t = min(1.0, (progress - args.warmup) / (1.0 - args.warmup))
    floor = args.lr * args.min_lr_ratio
    return floor + 0.5 * (args.lr - floor) * (1.0 + math.cos(math.pi * t))


def save_checkpoint(folder: Path, state: dict) -> None:
    """``state`` to ``folder/state.pt`` atomically: a cut-off write leaves the previous one."""
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write(folder / "state.pt", lambda tmp: torch.save(state, tmp))


def train(model, stream, args, log, resume: dict | None = None, checkpoint=None) -> Progress:
    """The training loop; returns how many steps and tokens it ran and for how long.

    ``resume`` is a state written by ``checkpoint(state)``, which is called every
    ``args.checkpoint_every`` minutes with everything needed to continue.
    """
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]  # norms
    optimizer = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": args.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=args.lr,
        betas=(0.9, 0.95),
    )
    gen = torch.Generator().manual_seed(args.seed + 1)
    mix = RecallMix(
        args.recall_fraction,
        args.recall_lengths,
        args.recall_tasks,
        args.seed,
        args.recall_stretch_fraction,
    )
    budget = args.minutes * 60.0
    done = Progress()
    spent = 0.0  # seconds of training before this process (a resumed run)
    if resume is not None:
        optimizer.load_state_dict(resume["optimizer"])
        gen.set_state(resume["generator"])
        mix.load_state(resume["recall_mix"])
        done = Progress(**resume["progress"])
        spent = done.seconds
        log(f"resumed at step {done.steps()}, {spent / 60:.1f} min in")
    start = time.perf_counter()
    last_checkpoint = start
    model.train()
    while True:
        elapsed = spent + time.perf_counter() - start
        step = done.steps()
        progress = step / args.steps if args.steps is not None else elapsed / budget
        # The end of training is checkpointed too: a run cut off while it evaluates and saves
        # then resumes straight into the evaluation.
        due = time.perf_counter() - last_checkpoint >= 60 * args.checkpoint_every
        if args.checkpoint_every and (due or progress >= 1.0):
            done.seconds = elapsed
            checkpoint(
                {
                    "optimizer": optimizer.state_dict(),
                    "generator": gen.get_state(),
                    "recall_mix": mix.state(),
                    "progress": vars(done).copy(),
                }
            )
            model.train()
            last_checkpoint = time.perf_counter()
        if progress >= 1.0:
            break
        copying = step < args.copy_steps
        length = LONG_LEN if progress >= 1.0 - args.long_fraction else SHORT_LEN
        lr = learning_rate(progress, args)
        for group in optimizer.param_groups:
            group["lr"] = lr
        if copying:
            length = COPY_LEN
            ids = copy_batch(args.batch_tokens // length, length, gen)
        else:
            ids = sample_batch(stream, args.batch_tokens // length, length, gen)
        use_mix = length == LONG_LEN and args.recall_fraction and not copying
        recall = mix.rows(ids, done) if use_mix else None
        logits = model(input_ids=ids[:, :-1], use_cache=False).logits  # (batch, length, 256)
        per_byte = torch.nn.functional.cross_entropy(
            logits.reshape(-1, 256), ids[:, 1:].reshape(-1), reduction="none"
        )
        counted = per_byte if recall is None else per_byte[~recall.stretch.reshape(-1)]
        loss = counted.mean()
        answer_loss = None
        if recall is not None and recall.questions.any():
            questions, answers = recall.questions.reshape(-1), recall.answers.reshape(-1)
            loss = loss + args.recall_weight * per_byte[questions].mean()
            answer_loss = per_byte[answers].detach().mean()  # logged: the part that is recall
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if copying:
            done.steps_copy += 1
        elif length == LONG_LEN:
            done.steps_long += 1
        else:
            done.steps_short += 1
        done.tokens += ids.shape[0] * length
        if (step + 1) % args.log_every == 0:
            answer = f" answer {answer_loss.item():.3f}" if answer_loss is not None else ""
            log(
                f"step {step + 1} {'copy' if copying else 'len'} {length} "
                f"loss {loss.item():.4f}{answer} lr {lr:.2e} "
                f"tokens {done.tokens:,} {elapsed / 60:.1f} min"
            )
    done.seconds = spent + time.perf_counter() - start
    model.eval()
    return done
