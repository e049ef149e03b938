"""The command line's one vocabulary (docs/cli.md, "One name per meaning"): no option string
means two things across the verbs, the old spellings still work with a warning or are refused
with one line naming the new flag, and the defaults and choices are the library's own, read
here from ``dataclasses.fields``, the enums and the functions' signatures."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import inspect
import types
import typing
from collections import defaultdict
from enum import Enum
from pathlib import Path

import pytest
from cli_support import cli_error

from kvpop_compile.cli import build_parser, main
from kvpop_compile.cli import parser as cli_parser
from kvpop_compile.cli.arguments import DeprecatedAliases, Refused, config_from_arguments
from kvpop_compile.config import KVpopConfig, ScorerKind
from kvpop_compile.training import TargetKind, TrainSettings
from kvpop_compile.training.scorer_loss import LossKind

BUDGET_VERBS = ("bench", "export", "train")


def verbs() -> dict[str, argparse.ArgumentParser]:
    """Each verb's parser, by name."""
    (subparsers,) = [
        action
        for action in build_parser()._actions
        if isinstance(action, argparse._SubParsersAction)
    ]
    return dict(subparsers.choices)


def arguments(verb: argparse.ArgumentParser) -> list[argparse.Action]:
    """A verb's arguments that mean something (not ``--help``, not a refused spelling)."""
    return [a for a in verb._actions if a.dest != "help" and not isinstance(a, Refused)]


def value_type(action: argparse.Action):
    """The type of the value an argument holds: what its ``type`` returns (a string where it
    has none; a switch holds a bool)."""
    if action.nargs == 0:
        return bool
    if action.type is None:
        return str
    if isinstance(action.type, type):
        return action.type
    return typing.get_type_hints(action.type)["return"]


def meaning(action: argparse.Action) -> tuple:
    """What an option means: where its value goes, how many values it takes and of which
    type, and how it stores them (a deprecated alias stores as a plain option does)."""
    kind = "store" if isinstance(action, DeprecatedAliases) else type(action).__name__
    kind = {"_StoreAction": "store"}.get(kind, kind)
    return (action.dest, action.nargs, action.const, kind, value_type(action))


def option(verb: str, flag: str) -> argparse.Action:
    """The argument of ``verb`` spelled ``flag``."""
    (action,) = [a for a in verbs()[verb]._actions if flag in a.option_strings]
    return action


def library_default(kind: type, name: str):
    """The default of a dataclass field, from ``dataclasses.fields`` (an enum as its value)."""
    (field,) = [f for f in dataclasses.fields(kind) if f.name == name]
    default = field.default
    return default.value if isinstance(default, Enum) else default


@pytest.fixture
def checkpoint(tmp_path):
    """A folder the --model type takes (it reads nothing but config.json's presence)."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    return str(tmp_path / "model")


def required(verb: str, checkpoint: str) -> list[str]:
    """The least a verb parses with."""
    return {
        "bench": ["bench", "--shape", "tiny"],
        "export": ["export", "--model", checkpoint, "--out", "engine"],
        "train": ["train", "--model", checkpoint, "--data", "data", "--out", "run"],
    }[verb]


def test_no_option_string_means_two_things_across_verbs():
    meanings = defaultdict(dict)
    for name, verb in verbs().items():
        for action in arguments(verb):
            for option in action.option_strings:
                meanings[option][name] = meaning(action)
    shared = {option: by_verb for option, by_verb in meanings.items() if len(by_verb) > 1}
    assert {"--model", "--scorer", "--scorer-path", "--policy", "--batch"} <= set(shared)
    for option, by_verb in shared.items():
        assert len(set(by_verb.values())) == 1, (option, by_verb)


def test_each_meaning_has_one_spelling_across_verbs():
    spellings = defaultdict(set)
    for verb in verbs().values():
        for action in arguments(verb):
            if action.option_strings:
                spellings[action.dest].add(action.option_strings[0])
    assert {dest: names for dest, names in spellings.items() if len(names) > 1} == {}


def test_scorer_is_a_kind_and_scorer_path_a_folder_on_every_verb():
    for name, verb in verbs().items():
        for action in arguments(verb):
            if "--scorer" in action.option_strings:
                assert name in BUDGET_VERBS
                assert action.choices == [kind.value for kind in ScorerKind]
            if "--scorer-path" in action.option_strings:
                assert action.dest == "scorer_path" and action.type is None


@pytest.mark.parametrize(
    ("argv", "verb"),
    [(["demo", "--scorer", "runs/scorer"], "demo"),
     (["serve", "model", "--scorer", "runs/scorer"], "serve")],
)  # fmt: skip
def test_an_old_scorer_folder_flag_is_refused_naming_scorer_path(argv, verb, capsys):
    line = cli_error(argv, capsys)
    assert line == (
        f"kvpop-compile {verb}: --scorer runs/scorer: --scorer names a scorer kind (the policy "
        "of a budget: bench, export, train), not a trained scorer folder: use --scorer-path "
        "runs/scorer"
    )
    line = cli_error([*argv[:-1]], capsys)  # without its value too
    assert line.startswith(f"kvpop-compile {verb}: --scorer: ") and "use --scorer-path" in line


def test_every_refused_spelling_names_a_flag_of_its_verb_and_means_something_elsewhere():
    parsers = verbs()
    refused = [(name, action) for name, verb in parsers.items() for action in verb._actions
               if isinstance(action, Refused)]  # fmt: skip
    assert {name for name, _ in refused} == {"demo", "serve"}
    for name, action in refused:
        own = {s for a in arguments(parsers[name]) for s in a.option_strings}
        assert action.use in own
        for old in action.option_strings:
            assert old not in own
            assert any(old in a.option_strings for other in parsers.values()
                       for a in arguments(other))  # fmt: skip


def deprecated_aliases() -> list[tuple[str, argparse.Action, str]]:
    return [
        (name, action, old)
        for name, verb in verbs().items()
        for action in verb._actions
        if isinstance(action, DeprecatedAliases)
        for old in action.deprecated
    ]


def test_the_deprecated_aliases_are_the_ones_documented():
    assert [(name, a.option_strings[0], old) for name, a, old in deprecated_aliases()] == [
        ("eval", "--scorer-root", "--scorers")
    ]


@pytest.mark.parametrize(("verb", "action", "old"), deprecated_aliases())
def test_every_deprecated_alias_still_works_and_warns_in_one_line(verb, action, old, capsys):
    new = action.option_strings[0]
    parsed = build_parser().parse_args([verb, new, "value"])
    assert getattr(parsed, action.dest) == "value" and capsys.readouterr().err == ""
    parsed = build_parser().parse_args([verb, old, "value"])
    assert getattr(parsed, action.dest) == "value"
    assert capsys.readouterr().err == (
        f"kvpop-compile {verb}: {old} is deprecated, use {new} (the same option)\n"
    )


def test_eval_scorers_runs_eval_with_the_scorer_root(monkeypatch, capsys, tmp_path):
    ran = []
    monkeypatch.setattr(cli_parser, "eval_command", lambda args: ran.append(args) or 0)
    assert main(["eval", "--scorers", str(tmp_path), "--policies", "memory"]) == 0
    (args,) = ran
    assert args.scorer_root == str(tmp_path) and not hasattr(args, "scorers")
    assert capsys.readouterr().err.splitlines() == [
        "kvpop-compile eval: --scorers is deprecated, use --scorer-root (the same option)"
    ]


@pytest.mark.parametrize("verb", BUDGET_VERBS)
def test_budget_defaults_are_kvpop_configs_field_defaults(verb, checkpoint):
    for field in dataclasses.fields(KVpopConfig):
        options = [a for a in verbs()[verb]._actions if a.dest == field.name]
        if field.name in ("sinks", "window", "topk", "lam", "scorer", "priority_span"):
            (action,) = options
            assert action.default == library_default(KVpopConfig, field.name)
    args = build_parser().parse_args(required(verb, checkpoint))
    assert config_from_arguments(args) == KVpopConfig()
    assert option(verb, "--scorer").choices == [kind.value for kind in ScorerKind]


@pytest.mark.parametrize(
    ("name", "values"),
    [("sinks", ["-1", "0", "1"]), ("window", ["-1", "0", "1"]), ("topk", ["-1", "0", "1"]),
     ("priority_span", ["-1", "0", "3"]), ("lam", ["-1", "nan", "0", "0.5"])],
)  # fmt: skip
def test_budget_flags_refuse_exactly_what_kvpop_config_refuses(name, values, checkpoint, capsys):
    flag = "--" + name.replace("_", "-")
    for value in values:
        number = float(value) if name == "lam" else int(value)
        try:
            KVpopConfig(**{name: number})
            valid = True
        except ValueError:
            valid = False
        argv = [*required("export", checkpoint), flag, value]
        if valid:
            assert getattr(build_parser().parse_args(argv), name) == number
        else:
            assert cli_error(argv, capsys).startswith(f"kvpop-compile export: argument {flag}: ")


def test_train_defaults_and_choices_are_train_settings_and_the_training_enums(checkpoint):
    args = build_parser().parse_args(required("train", checkpoint))
    flags = {"steps", "seq_len", "batch_size", "lr", "loss", "target", "eval_every",
             "checkpoint_every", "init_from", "recall_fraction", "target_power"}  # fmt: skip
    for name in flags:
        assert getattr(args, name) == library_default(TrainSettings, name), name
    assert args.no_resume is not library_default(TrainSettings, "resume")
    assert option("train", "--loss").choices == [kind.value for kind in LossKind]
    assert option("train", "--target").choices == [kind.value for kind in TargetKind]


def test_evaluation_defaults_are_the_librarys():
    from kvpop_compile.engines import FORMATS, export
    from kvpop_compile.evaluation import EvalSettings
    from kvpop_compile.evaluation.bench import BenchSettings
    from kvpop_compile.evaluation.demo import run_demo
    from kvpop_compile.evaluation.recall import RecallSettings

    demo = inspect.signature(run_demo).parameters
    for name in ("items", "context", "policy", "capacity", "image"):
        assert option("demo", f"--{name}").default == demo[name].default
    assert option("eval", "--batch").default == library_default(EvalSettings, "batch")
    for name in ("items", "lengths", "protocols", "families"):
        action = option("eval", f"--recall-{name}")
        assert action.default == library_default(RecallSettings, name)
    for name in ("decode_tokens", "warmup", "batch"):
        action = option("bench", "--" + name.replace("_", "-"))
        assert action.default == library_default(BenchSettings, name)
    assert option("bench", "--methods").default == [library_default(BenchSettings, "methods")]
    exported = inspect.signature(export).parameters
    assert option("export", "--format").default == exported["format"].default
    assert option("export", "--format").choices == list(FORMATS)
    assert option("export", "--batch").default == exported["batch"].default


def test_the_parser_restates_no_library_default_or_choice_list():
    """The literals the library defines appear in the CLI's source only through the library:
    none of KVpopConfig's budget defaults, the training defaults or the enums' value lists."""
    source = "\n".join(path.read_text() for path in Path(cli_parser.__file__).parent.glob("*.py"))
    for literal in ("default=4)", "default=256", "default=3836", "default=200", "default=512",
                    "default=1e-3", '"boundary", "gap"', '"mean", "max"', 'default="memory"',
                    'default="window"', "default=16", "default=3,", 'default="aoti"'):  # fmt: skip
        assert literal not in source, literal


def test_demo_and_serve_hand_their_scorer_path_on(monkeypatch, tmp_path):
    import kvpop_compile.evaluation.demo as demo

    runs = []

    @functools.wraps(demo.run_demo)
    def run_demo(**arguments):
        runs.append(arguments)
        return types.SimpleNamespace(report=lambda: [])

    monkeypatch.setattr(demo, "run_demo", run_demo)
    assert main(["demo", "--scorer-path", str(tmp_path), "--no-image"]) == 0
    assert runs[0]["scorer"] == str(tmp_path)
    served = []
    monkeypatch.setattr(cli_parser, "serve_command", lambda args: served.append(args) or 0)
    assert main(["serve", "model", "--scorer-path", str(tmp_path), "--capacity", "300"]) == 0
    assert served[0].scorer_path == str(tmp_path) and served[0].capacity == 300
    assert main(["serve", "model", "--policy", "tova"]) == 0
    assert served[1].scorer_path is None and served[1].policy == "tova"
