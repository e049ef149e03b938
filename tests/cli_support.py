"""The one-line error a CLI call prints, for the tests of refused input."""

from kvpop_compile.cli import main


def cli_error(argv, capsys) -> str:
    """The one line ``kvpop-compile argv`` prints on stderr, having exited with status 2.
    Progress bars that ran before the error (transformers' "Loading weights") are left out."""
    try:
        status = main([str(a) for a in argv])
    except SystemExit as exit:
        status = exit.code
    captured = capsys.readouterr()
    assert status == 2, captured
    lines = [line for line in captured.err.splitlines() if line and "it/s]" not in line]
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    return lines[0]
