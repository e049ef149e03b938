"""The command line's argument types: each checks one value as it is parsed (before a model
loads) and refuses a bad one with a message naming it and what is allowed; the defaults and
choices the flags take from the library; and the actions of old flag spellings (deprecated
aliases that warn, refused spellings that name the new flag)."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import math
import re
import sys
from collections.abc import Callable
from enum import Enum
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

    parse.describes = f"integer >= {minimum}"
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

    parse.describes = f"number {bound}"
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
    from ..evaluation.bench import parse_contexts

    try:
        return parse_contexts(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def bench_methods(text: str) -> tuple[str, ...]:
    """argparse type: benchmark methods, comma-separated."""
    from ..evaluation.bench import METHODS

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


def field_default(kind: type, name: str):
    """The default of field ``name`` of the dataclass ``kind`` (an enum member as its value), as
    the library defines it: a flag that sets the field shows and uses it."""
    (field,) = [field for field in dataclasses.fields(kind) if field.name == name]
    if field.default is not dataclasses.MISSING:
        default = field.default
    else:
        default = field.default_factory()
    return default.value if isinstance(default, Enum) else default


def parameter_default(function: Callable, name: str):
    """The default of ``function``'s keyword parameter ``name`` (a stand-in for ``function``,
    such as a test's recorder, keeps it with ``functools.wraps``)."""
    parameter = inspect.signature(function).parameters.get(name)
    if parameter is None or parameter.default is inspect.Parameter.empty:
        raise TypeError(f"{function.__qualname__} has no parameter {name!r} with a default")
    return parameter.default


def enum_values(kind: type[Enum]) -> list[str]:
    """The values of the enum ``kind``, in its order: the choices of a flag that names one."""
    return [member.value for member in kind]


# The policy's budget: the ``KVpopConfig`` fields a command line sets, each a flag spelled like
# its field, with its type and help; the default and the choices come from KVpopConfig and
# ScorerKind (parser.budget_arguments).
BUDGET_FIELDS = {
    "sinks": (integer(0), "the first positions, always kept"),
    "window": (integer(1), "the most recent tokens, the current one included, always kept"),
    "topk": (
        integer(0),
        "the pool: older tokens of highest priority; the capacity per layer and KV head is "
        "sinks + window + topk",
    ),
    "lam": (
        number(positive=False),
        "a token's priority rises by LAM per position, so that of two tokens scored alike the "
        "newer stays",
    ),
    "scorer": (None, "the policy that scores the tokens leaving the window"),
    "priority_span": (
        integer(0),
        "a token's score also counts for the P tokens that leave the window after it; 0: off",
    ),
}


def config_from_arguments(args: argparse.Namespace):
    """The ``KVpopConfig`` of the budget flags (:data:`BUDGET_FIELDS`)."""
    from ..config import KVpopConfig

    return KVpopConfig(**{name: getattr(args, name) for name in BUDGET_FIELDS})


class DeprecatedAliases(argparse.Action):
    """``store``, where the option strings in ``deprecated`` are old spellings of the first
    one: they still work, and each use prints one line on stderr naming the new spelling."""

    def __init__(self, option_strings, dest, deprecated=(), help=None, **kwargs):
        self.deprecated = tuple(deprecated)
        unknown = [name for name in self.deprecated if name not in option_strings[1:]]
        if unknown:
            raise ValueError(f"deprecated spellings {unknown} are not aliases of {option_strings}")
        if help is not None and self.deprecated:
            help = f"{help}; {', '.join(self.deprecated)}: deprecated spelling"
        super().__init__(option_strings, dest, help=help, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        if option_string in self.deprecated:
            print(
                f"{parser.prog}: {option_string} is deprecated, use {self.option_strings[0]} "
                "(the same option)",
                file=sys.stderr,
            )
        setattr(namespace, self.dest, values)


class Refused(argparse.Action):
    """An old spelling that a verb refuses because it would now mean something else there: its
    use ends in one line naming ``use``, the flag that now takes the value, and ``why``."""

    def __init__(self, option_strings, dest, use: str, why: str, **_):
        self.use, self.why = use, why
        super().__init__(
            option_strings, argparse.SUPPRESS, nargs="?", default=argparse.SUPPRESS,
            help=argparse.SUPPRESS,
        )  # fmt: skip

    def __call__(self, parser, namespace, values, option_string=None):
        value = "" if values is None else f" {values}"
        parser.error(f"{option_string}{value}: {self.why}: use {self.use}{value}")
