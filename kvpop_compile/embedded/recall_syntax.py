"""The ways a recall item binds a key to a value and asks for it: syntax families and alphabets.

A *family* is one way to write a binding (``QZWKRT = 4821``, ``<qzwkrt>4821</qzwkrt>``,
``export QZWKRT=4821`` …) together with one way to ask for it (``assert QZWKRT == ``,
``<qzwkrt>``, ``assert os.environ["QZWKRT"] == `` …): a question whose continuation is the
value. Some families ask with an exact repeat of the binding's prefix, which only copying
answers; the others ask in words of their own, so the model must find the key and skip to what
follows it. An *alphabet* is how values are written: decimal digits, hex, letters, codes.

Families and alphabets are split three ways, whole (:data:`FAMILY_SPLITS`): ``train`` ones are
what a model or a scorer is trained on; ``validation`` ones choose among trained candidates;
``held_out`` ones are asked by the benchmark's held-out-family rows and by nothing else, so
that those rows measure recall in syntaxes and alphabets no training step saw. A held-out
group draws values from its own alphabet and from the training alphabets alike, so its items
differ from training ones in syntax always and in alphabet half of the time.
"""

from __future__ import annotations

import keyword
import random
import string
from dataclasses import dataclass

FAMILY_SPLITS = ("train", "validation", "held_out")
NAME_LETTERS = 6


@dataclass(frozen=True)
class Family:
    """A binding syntax and its question.

    ``bind`` and ``ask`` are ``str.format`` templates over ``key`` and (``bind`` only)
    ``value``; ``bind`` may span lines and ends without a newline. ``upper`` writes the key in
    capitals. The question is one line, the last of the prompt.
    """

    name: str
    bind: str
    ask: str
    upper: bool = False

    def binding(self, key: str, value: str) -> str:
        """The planted line(s), newline-terminated."""
        return self.bind.format(key=key, value=value) + "\n"

    def question(self, key: str) -> str:
        """The prompt's last line, after a newline: its continuation is the value."""
        return "\n" + self.ask.format(key=key)


@dataclass(frozen=True)
class Alphabet:
    """How values are written: ``prefix`` then ``low..high`` characters of ``chars`` (the
    first never ``"0"`` for decimals, so a value reads as the number it is)."""

    name: str
    chars: str
    low: int
    high: int
    prefix: str = ""

    def draw(self, rng: random.Random) -> str:
        n = rng.randint(self.low, self.high)
        first = self.chars.replace("0", "") if self.name == "decimal" else self.chars
        body = rng.choice(first) + "".join(rng.choice(self.chars) for _ in range(n - 1))
        return self.prefix + body


FAMILIES: dict[str, tuple[Family, ...]] = {
    "train": (
        Family("assignment", "{key} = {value}", "assert {key} == ", upper=True),
        Family("function", "def {key}():\n    return {value}", "assert {key}() == "),
        Family("mapping", '    "{key}": {value},', 'assert table["{key}"] == '),
        Family("keyword", "    configure({key}={value})", "assert options.{key} == "),
        Family("attribute", "        self.{key} = {value}", "assert self.{key} == "),
        Family("comment", "# {key}: {value}", "# {key}: "),
        Family("environment", "export {key}={value}", 'assert os.environ["{key}"] == ', True),
        Family(
            "docstring", "    :param {key}: defaults to {value}", 'assert defaults["{key}"] == '
        ),
        Family("markup", "<{key}>{value}</{key}>", "<{key}>"),
        Family("pairs", '    ("{key}", {value}),', 'assert dict(pairs)["{key}"] == '),
        Family("config", "{key}={value}", 'assert parser.get("{key}") == '),
        Family(
            "argument",
            '    parser.add_argument("--{key}", default={value})',
            "assert args.{key} == ",
        ),
        Family("log", "INFO set {key} to {value}", "INFO set {key} to "),
    ),
    "validation": (
        Family("record", '{{"name": "{key}", "value": {value}}}', 'assert lookup("{key}") == '),
        Family("toml", '{key} = "{value}"', '{key} = "'),
        Family("constant", "    {key} = {value}", "assert Settings.{key} == ", upper=True),
        Family("sql", "INSERT INTO settings VALUES ('{key}', {value});", "-- '{key}' holds "),
    ),
    "held_out": (
        Family("html", '<input name="{key}" value="{value}">', '<input name="{key}" value="'),
        Family("setdefault", 'options.setdefault("{key}", {value})', 'assert options["{key}"] == '),
        Family("arrow", "{key} => {value}", 'assert table.get("{key}") == '),
        Family("prose", "# the {key} is {value}", "# the {key} is "),
        Family("makefile", "{key} := {value}", "assert make_var('{key}') == ", upper=True),
    ),
}

ALPHABETS: dict[str, tuple[Alphabet, ...]] = {
    "train": (
        Alphabet("decimal", string.digits, 1, 8),
        Alphabet("letters", string.ascii_lowercase, 3, 8),
    ),
    "validation": (Alphabet("hex", "0123456789abcdef", 2, 8, prefix="0x"),),
    "held_out": (Alphabet("code", string.ascii_uppercase + string.digits, 4, 8),),
}


def check_family_split(families: str) -> None:
    if families not in FAMILY_SPLITS:
        raise ValueError(f"families must be one of {FAMILY_SPLITS}, got {families!r}")


def family_names(families: str) -> tuple[str, ...]:
    """The names of the families of one split."""
    check_family_split(families)
    return tuple(f.name for f in FAMILIES[families])


def draw_family(rng: random.Random, families: str) -> Family:
    """A family of split ``families``; for ``train``, half of the time a generated one
    (:func:`generated_family`), so training sees thousands of syntaxes, not a dozen."""
    check_family_split(families)
    if families == "train" and rng.random() < GENERATED_SHARE:
        return generated_family(rng)
    return rng.choice(FAMILIES[families])


GENERATED_SHARE = 0.5
"""Share of training items in a generated family rather than a named one."""
# The pieces generated bindings and questions are made of. None of the validation or held-out
# families' marks (``:=``, ``=>``, ``the … is``, ``value="``, ``setdefault``, ``INSERT``,
# ``holds``, ``lookup(``, ``Settings.``, ``make_var``, ``table.get``, ``{"name"``) is among them,
# and a generated family equal to a named one of another split is redrawn.
_INDENTS = ("", "    ", "        ", "\t")
_LEADS = ("", "set ", "let ", "var ", "self.", "cfg.", "- ", "* ", "# ", "// ", "; ", "@", "$",
          "const ", "opt ", "> ")  # fmt: skip
_KEY_QUOTES = (("", ""), ('"', '"'), ("'", "'"), ("`", "`"), ("[", "]"), ("<", ">"))
_SEPARATORS = (" = ", "=", ": ", ":", " -> ", " ", "\t", ", ", " == ", " to ", " <- ", " ~ ")
# Braces are doubled: these are pieces of str.format templates.
_VALUE_QUOTES = (("", ""), ("'", "'"), ("(", ")"), ("[", "]"), ("{{", "}}"), ("`", "`"))
_TRAILS = ("", ",", ";", " }}", ")", "  # default", " \\", " .")
_ACCESSORS = ("{key}", 'config["{key}"]', "get('{key}')", "{key}()", "self.{key}", "env.{key}",
              "args['{key}']", "opts.get('{key}')", "values['{key}']", "read({key})")  # fmt: skip
_ASK_LEADS = ("assert ", "print(", "# ", "", "return ", "expect ", "check(")
_ASK_SEPARATORS = (" == ", " -> ", ": ", " = ", ")  # ", " is ", " ~ ")
REPEAT_SHARE = 1 / 3
"""Share of generated families asked by an exact repeat of the binding up to the value."""


def generated_family(rng: random.Random) -> Family:
    """A training family put together from random pieces: an indent, a lead word, the key
    (maybe quoted), a separator, the value (maybe quoted) and a trail; asked by an exact
    repeat of the binding up to its value or by an accessor expression and a separator."""
    while True:
        kq, vq = rng.choice(_KEY_QUOTES), rng.choice(_VALUE_QUOTES)
        bind = (
            f"{rng.choice(_INDENTS)}{rng.choice(_LEADS)}{kq[0]}{{key}}{kq[1]}"
            f"{rng.choice(_SEPARATORS)}{vq[0]}{{value}}{vq[1]}{rng.choice(_TRAILS)}"
        )
        if rng.random() < REPEAT_SHARE:
            ask = bind.split("{value}")[0].lstrip()
        else:
            ask = f"{rng.choice(_ASK_LEADS)}{rng.choice(_ACCESSORS)}{rng.choice(_ASK_SEPARATORS)}"
        family = Family("generated", bind, ask, upper=rng.random() < 0.5)
        if (bind, ask) not in _NAMED_ELSEWHERE and bind not in _NAMED_BINDINGS:
            return family


_NAMED_ELSEWHERE = {
    (f.bind, f.ask) for split in ("validation", "held_out") for f in FAMILIES[split]
}
_NAMED_BINDINGS = {f.bind for split in ("validation", "held_out") for f in FAMILIES[split]}


def draw_alphabet(rng: random.Random, families: str) -> Alphabet:
    """An alphabet of split ``families``: a held-out split's own or a training one, even odds,
    so its items are new in syntax always and in alphabet half of the time."""
    check_family_split(families)
    if families == "train" or rng.random() < 0.5:
        return rng.choice(ALPHABETS[families])
    return rng.choice(ALPHABETS["train"])


def draw_keys(rng: random.Random, n: int, upper: bool) -> list[str]:
    """``n`` distinct keys of :data:`NAME_LETTERS` random letters, none a Python keyword. A
    list in draw order, not a set: a set's order follows the per-process string hash, and an
    item must be the same in every process for its seed."""
    letters = string.ascii_uppercase if upper else string.ascii_lowercase
    keys: list[str] = []
    while len(keys) < n:
        key = "".join(rng.choice(letters) for _ in range(NAME_LETTERS))
        if not keyword.iskeyword(key) and key not in keys:
            keys.append(key)
    return keys


def draw_values(rng: random.Random, n: int, alphabet: Alphabet) -> list[str]:
    """``n`` distinct values of ``alphabet``, none a prefix of another (an answer must not be
    the start of a decoy's)."""
    values: list[str] = []
    while len(values) < n:
        value = alphabet.draw(rng)
        if not any(value.startswith(v) or v.startswith(value) for v in values):
            values.append(value)
    return values
