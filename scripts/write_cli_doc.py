"""Write docs/cli.md, the reference of the ``kvpop-compile`` command line, from its parser
(:func:`kvpop_compile.cli.build_parser`): the naming rule its flags follow, the old spellings
it still takes or refuses, and every verb with every flag, its value, default and help.
``tests/cli/test_cli_doc.py`` fails when docs/cli.md differs from what this writes, so a
renamed flag or a changed default cannot leave the page behind.

    python scripts/write_cli_doc.py           # rewrite docs/cli.md
    python scripts/write_cli_doc.py --check   # exit 1 if docs/cli.md is not what it would write
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvpop_compile.cli import build_parser
from kvpop_compile.cli.arguments import DeprecatedAliases, Refused

DOC = Path(__file__).resolve().parents[1] / "docs" / "cli.md"

RULE = """\
## One name per meaning

The flags of all verbs follow one vocabulary; `tests/cli/test_cli_vocabulary.py` checks it on
the parser.

1. **A flag that sets a library setting is spelled like the setting** (`priority_span` →
   `--priority-span`) and takes its default and its choices from the code, never restated: the
   budget flags `--sinks`, `--window`, `--topk`, `--lam`, `--scorer` and `--priority-span` are
   `KVpopConfig`'s fields with its defaults, `--scorer` choosing among `ScorerKind`; `train`'s
   `--steps`, `--seq-len`, `--batch-size`, `--lr`, `--loss`, `--target`, `--recall-fraction`,
   `--eval-every` and `--checkpoint-every` are `TrainSettings`' fields, `--loss` and `--target`
   choosing among `LossKind` and `TargetKind`; the other defaults are those of `EvalSettings`,
   `RecallSettings`, `BenchSettings`, `run_demo` and `export`.
2. **A spelling means one thing on every verb** (same destination, same kind of value):
   - `--scorer KIND` is always the scorer kind of a budget (`KVpopConfig.scorer`), never a
     folder.
   - `--scorer-path DIR` is always one trained scorer folder (written by `save_scorer` or
     `kvpop-compile train`); `--scorer-root DIR` is a folder of them, one
     `<policy>-<capacity>/` each; `train --init-from DIR` is the scorer folder training starts
     from.
   - `--policy` names one policy run beside KVpop's trained scorer or instead of it (`demo`'s
     heuristic baseline, `serve`'s heuristic), `--policies` several (`eval`'s rows).
   - `--methods` is `bench`'s ways of running a cache (transformers' caches and KVpop's
     execution paths), not policies.
   - `--model` is a local checkpoint folder, `--data` your own text, `--out` the folder a verb
     writes, `--batch` the sequences a forward or an engine call runs together (`train`'s
     sequences per optimizer step are `--batch-size`, `TrainSettings.batch_size`, by rule 1).
3. **Singular for one value, plural for several**: `--policy` / `--policies`, `--context` /
   `--contexts`, `--scorer-path` (one folder) / `--scorer-root` (a folder of folders).
4. **Old spellings** keep working as deprecated aliases (one line on stderr names the new
   spelling) where nothing else in their verb claims them; where an old spelling would now mean
   something else, it is refused with one line naming the flag that takes its value now.
"""


def verbs(parser: argparse.ArgumentParser) -> dict[str, tuple[argparse.ArgumentParser, str]]:
    """Each verb's name -> (its parser, its one-line help), in the parser's order."""
    (subparsers,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    helps = {choice.dest: choice.help for choice in subparsers._choices_actions}
    return {name: (verb, helps[name]) for name, verb in subparsers.choices.items()}


def shown(actions: list[argparse.Action]) -> list[argparse.Action]:
    """The documented arguments: all but ``--help`` and refused spellings."""
    return [a for a in actions if a.help is not argparse.SUPPRESS and a.dest != "help"]


def default_text(default) -> str:
    """A default as it is typed: a list space-separated (several values), a tuple
    comma-separated (one comma-separated value)."""
    if isinstance(default, list):
        return " ".join(default_text(item) for item in default)
    if isinstance(default, tuple):
        return ",".join(default_text(item) for item in default)
    return str(default)


def value_text(action: argparse.Action) -> str:
    """What an argument takes: nothing for a switch, its choices, or its kind of value."""
    if action.nargs == 0:
        return "(switch)"
    if action.choices is not None:
        text = " | ".join(f"`{choice}`" for choice in action.choices)
    else:
        text = f"`{action.metavar or action.dest.upper()}`"
        describes = getattr(action.type, "describes", None)
        if describes:
            text += f" ({describes})"
    return f"{text} …" if action.nargs in ("+", "*") else text


def cell(text: str) -> str:
    """``text`` in one Markdown table cell: on one line, its bars and angle brackets escaped
    (``<policy>-<capacity>`` is no HTML tag)."""
    text = " ".join(text.split())
    for character in "|<>":
        text = text.replace(character, "\\" + character)
    return text


def help_text(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """An argument's help as ``--help`` shows it (``%(default)s`` filled in), with what makes
    it required or excludes it."""
    params = {**vars(action), "prog": parser.prog}
    text = (action.help or "") % params
    if action.required:
        text = f"required; {text}"
    for group in parser._mutually_exclusive_groups:
        if action in group._group_actions:
            names = ", ".join(f"`{a.option_strings[0]}`" for a in group._group_actions)
            text += f"; {'one' if group.required else 'at most one'} of {names}"
    return text


def verb_section(name: str, parser: argparse.ArgumentParser, summary: str) -> list[str]:
    lines = [f"## `kvpop-compile {name}`", "", f"{summary[0].upper()}{summary[1:]}.", ""]
    lines += ["| flag | value | default | what it does |", "|---|---|---|---|"]
    for action in shown(parser._actions):
        flags = ", ".join(f"`{s}`" for s in action.option_strings) or f"`{action.dest.upper()}`"
        default = action.default
        empty = default is None or default is False or default is argparse.SUPPRESS
        default = "" if empty else f"`{default_text(default)}`"
        row = [flags, value_text(action), default, help_text(parser, action)]
        lines.append("| " + " | ".join(cell(text) for text in row) + " |")
    if parser.epilog:
        lines += ["", parser.epilog]
    return [*lines, ""]


def old_spellings(parser: argparse.ArgumentParser) -> list[str]:
    """The table of the old spellings every verb still takes (deprecated) or refuses."""
    rows = []
    for name, (verb, _) in verbs(parser).items():
        for action in verb._actions:
            if isinstance(action, DeprecatedAliases):
                for old in action.deprecated:
                    rows.append((name, old, action.option_strings[0], "deprecated alias: "
                                 "works, and warns on stderr"))  # fmt: skip
            elif isinstance(action, Refused):
                for old in action.option_strings:
                    rows.append((name, old, action.use, f"refused: {action.why}"))
    lines = ["## Old spellings", "", "| verb | old | now | |", "|---|---|---|---|"]
    for verb, old, new, status in rows:
        lines.append(f"| {verb} | `{old}` | `{new}` | {cell(status)} |")
    return [*lines, ""]


def render(parser: argparse.ArgumentParser | None = None) -> str:
    """docs/cli.md as the parser defines it."""
    parser = parser or build_parser()
    table = verbs(parser)
    lines = [
        "# The `kvpop-compile` command line",
        "",
        "<!-- Written by scripts/write_cli_doc.py from the parser (kvpop_compile/cli/parser.py); "
        "tests/cli/test_cli_doc.py fails when this file differs. Do not edit it by hand. -->",
        "",
        f"{parser.description} Run `kvpop-compile VERB --help` (or `python -m kvpop_compile`) "
        "for the same text on the terminal.",
        "",
        *(
            f"- [`{name}`](#kvpop-compile-{name}): {summary}"
            for name, (_, summary) in table.items()
        ),
        "",
        RULE,
        *old_spellings(parser),
    ]
    for name, (verb, summary) in table.items():
        lines += verb_section(name, verb, summary)
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument("--check", action="store_true", help="compare instead of writing")
    args = options.parse_args(argv)
    text = render()
    if args.check:
        current = DOC.read_text() if DOC.is_file() else ""
        if current != text:
            print(f"{DOC} is out of date: run python scripts/write_cli_doc.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(text)
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
