"""The command line's argument types: each checks one value as it is parsed (before a model
loads) and refuses a bad one with a message naming it and what is allowed."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from pathlib import Path


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (``prog: message``), like the library's."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message}\n")


def integer(minimum: int) -> Callable[[str], int]:
    """argparse type: an integer ``>= minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {text!r}")
        return value

    return parse


def number(*, positive: bool) -> Callable[[str], float]:
    """argparse type: a finite number, ``> 0`` if ``positive`` else ``>= 0``."""
    bound = "> 0" if positive else ">= 0"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < 0 or (positive and value == 0):
            raise argparse.ArgumentTypeError(f"must be a finite number {bound}, got {text!r}")
        return value

    return parse


def checkpoint_folder(text: str) -> str:
    """argparse type: a local Hugging Face checkpoint folder (never a hub name: nothing is
    downloaded)."""
    folder = Path(text)
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a folder; give a local Hugging Face checkpoint folder "
            "(config.json and the weights)"
        )
    if not (folder / "config.json").is_file():
        raise argparse.ArgumentTypeError(
            f"{text!r} has no config.json; give a local Hugging Face checkpoint folder "
            "(config.json and the weights)"
        )
    return text


def eval_data(text: str) -> str:
    """argparse type: ``eval --data``, an existing file or folder."""
    if not Path(text).exists():
        raise argparse.ArgumentTypeError(
            f"{text!r} does not exist; give a text file, a folder of text files or a .jsonl of "
            "prompt/answer records"
        )
    return text


def contexts(text: str) -> tuple[int, ...]:
    """argparse type: prompt lengths such as ``8k,32k`` (k = 1024 tokens)."""
    from ..evaluation.long_context_settings import parse_contexts

    try:
        return parse_contexts(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def bench_methods(text: str) -> tuple[str, ...]:
    """argparse type: benchmark methods, comma-separated."""
    from ..evaluation.long_context_settings import METHODS

    methods = tuple(item.strip() for item in text.split(","))
    for method in methods:
        if method not in METHODS:
            raise argparse.ArgumentTypeError(
                f"unknown method {method!r}; choose from {', '.join(METHODS)}"
            )
    return methods


def comma_choices(allowed: tuple, kind: Callable) -> Callable[[str], tuple]:
    """argparse type: a comma-separated subset of ``allowed``, each read with ``kind``, none
    given twice (it would be asked twice)."""

    def parse(text: str) -> tuple:
        chosen = []
        for item in text.split(","):
            try:
                value = kind(item.strip())
            except ValueError:
                value = None
            if value not in allowed:
                raise argparse.ArgumentTypeError(
                    f"{item.strip()!r} is not one of {', '.join(map(str, allowed))}"
                )
            if value in chosen:
                raise argparse.ArgumentTypeError(f"{item.strip()!r} is given twice in {text!r}")
            chosen.append(value)
        return tuple(chosen)

    return parse


def device(text: str) -> str:
    """argparse type: ``cpu``, ``cuda`` or ``cuda:N``, refused when CUDA is not available."""
    if text != "cpu" and not re.fullmatch(r"cuda(:\d+)?", text):
        raise argparse.ArgumentTypeError(f"must be cuda, cuda:N or cpu, got {text!r}")
    if text.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise argparse.ArgumentTypeError(
                f"{text!r} is not available here (torch.cuda.is_available() is False); use "
                "--device cpu"
            )
    return text


def config_from_arguments(args: argparse.Namespace):
    """The ``KVpopConfig`` of the :func:`budget_arguments`."""
    from ..config import KVpopConfig

    return KVpopConfig(
        sinks=args.sinks, window=args.window, topk=args.topk, lam=args.lam, scorer=args.scorer,
        priority_span=args.priority_span,
    )  # fmt: skip
