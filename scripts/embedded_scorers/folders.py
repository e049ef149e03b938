"""Saved scorer folders and the work folders scorers train in."""

from __future__ import annotations

import json
from pathlib import Path

import torch

import kvpop_compile as kc
from kvpop_compile.atomic import atomic_write, replace_folder
from kvpop_compile.scorer_io import load_layers, read_tensors
from kvpop_compile.training.trainer import CHECKPOINT

RUN_RECORD = "run.json"  # in a work folder: the command that trains there, and its measure
TRAINING_RECORD = "training.json"  # in a saved scorer folder: how the scorer was made and chosen


def with_tensors(transformed, scorer: Path):
    """``transformed`` (a transformed model) with the saved ``scorer``'s tensors in its scorers.
    Tensors only: load_scorer would refuse a window other than the one trained with, and the
    scorer scripts run scorers at other windows and budgets (--windows, --select-at saved, the
    choice scripts); names and shapes are still checked layer by layer."""
    load_layers(
        [layer.self_attn.scorer for layer in transformed.model.layers], read_tensors(scorer)
    )
    return transformed


def write_scorer(folder: Path, scorer: Path, record: dict, model, config: kc.KVpopConfig) -> None:
    """Save the tensors of the scorer folder ``scorer`` into ``folder``, saved for ``config``
    (``model`` transformed with it carries the weights, whatever capacity, window and span the
    scorer was trained at), with ``record`` as its ``training.json``."""
    kc.save_scorer(with_tensors(kc.transform(model, config), scorer), folder)
    (folder / TRAINING_RECORD).write_text(json.dumps(record, indent=1) + "\n")


def install(scorer: Path, target: Path, record: dict, model, config: kc.KVpopConfig) -> None:
    """:func:`write_scorer` into ``target``, atomically (built beside it, then swapped in)."""
    replace_folder(target, lambda folder: write_scorer(folder, scorer, record, model, config))


def claim_work(work: Path, command: str, spec: dict | None) -> None:
    """Record in ``work`` the command that trains there and its selection measure, or refuse a
    run whose measure differs from the one recorded: a resumed run would choose among numbers
    from two measures. A folder without a checkpoint holds nothing to mix, so its record is
    replaced; one with a checkpoint but no record is refused (its measure is unknown)."""
    record = work / RUN_RECORD
    started = (work / CHECKPOINT).is_file()
    if started and not record.is_file():
        raise SystemExit(
            f"{work} holds a run without {RUN_RECORD}, so its selection measure is unknown: "
            "give another --work"
        )
    if started:
        saved = json.loads(record.read_text())
        if saved.get("selection") != spec:
            raise SystemExit(
                f"{work} holds a run selected by {saved.get('selection')}, this run asks "
                f"{spec}: give another --work, or --reselect to choose among the finished "
                "run's candidates by this measure"
            )
        return
    work.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"command": command, "selection": spec}, indent=1) + "\n"
    atomic_write(record, lambda tmp: Path(tmp).write_text(text))


def finished_run(work: Path, steps: int) -> dict:
    """The run record (``{}`` if none was written) of the finished run in ``work`` that
    ``--reselect`` chooses again in; ``SystemExit`` if ``work`` holds no finished run, which
    ``--reselect`` would otherwise train."""
    checkpoint = work / CHECKPOINT
    if not checkpoint.is_file():
        raise SystemExit(f"--reselect: {work} holds no run (no {CHECKPOINT}); train it first")
    done = torch.load(checkpoint, map_location="cpu", weights_only=True)["step"]
    if done != steps:
        raise SystemExit(
            f"--reselect: the run in {work} is at step {done}, not --steps {steps}: give the "
            f"run's own settings ({RUN_RECORD} has its command), and finish it first if it "
            "was cut off"
        )
    record = work / RUN_RECORD
    return json.loads(record.read_text()) if record.is_file() else {}
