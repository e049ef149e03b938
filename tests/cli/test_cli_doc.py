"""docs/cli.md is what ``scripts/write_cli_doc.py`` writes from the parser: a renamed flag, a
changed default or help fails here until the page is written again."""

import difflib

from script_support import ROOT, load_script


def test_docs_cli_md_is_written_from_the_parser():
    script = load_script("scripts/write_cli_doc.py")
    written = (ROOT / "docs" / "cli.md").read_text()
    expected = script.render()
    difference = "".join(
        difflib.unified_diff(
            written.splitlines(keepends=True), expected.splitlines(keepends=True),
            "docs/cli.md", "the parser",
        )
    )  # fmt: skip
    assert written == expected, (
        f"docs/cli.md differs from the parser; run python scripts/write_cli_doc.py\n{difference}"
    )


def test_the_page_names_every_verb_and_option_and_the_old_spellings():
    script = load_script("scripts/write_cli_doc.py")
    page = script.render()
    for name, (verb, _) in script.verbs(script.build_parser()).items():
        assert f"## `kvpop-compile {name}`" in page
        for action in script.shown(verb._actions):
            for option in action.option_strings:
                assert f"`{option}`" in page, option
    assert "| eval | `--scorers` | `--scorer-root` | deprecated alias" in page
    assert "| demo | `--scorer` | `--scorer-path` | refused" in page


def test_check_mode_fails_on_a_stale_page(tmp_path, monkeypatch, capsys):
    script = load_script("scripts/write_cli_doc.py")
    monkeypatch.setattr(script, "DOC", tmp_path / "cli.md")
    assert script.main(["--check"]) == 1
    assert "out of date" in capsys.readouterr().err
    assert script.main([]) == 0 and script.main(["--check"]) == 0
    assert (tmp_path / "cli.md").read_text() == script.render()
