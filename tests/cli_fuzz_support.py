"""Shared by the CLI fuzz tests: the outcome of one fuzzed command line, and value strategies.

Every fuzzed command line must end one of these ways: accepted (a stub that stands where
heavy work would start raises `WouldRun`), done (light work finished, exit 0), an argparse
usage error (exit 2), or exactly one `starpo: error: ...` line on stderr with exit code 2
(after any `warning: ...` lines). Anything else, a traceback above all, fails the test.
"""

from __future__ import annotations

import string

from hypothesis import strategies as st

from starpo import cli


class WouldRun(Exception):
    """A stub's signal: the command line was accepted and heavy work would start here."""


def would_run(*args, **kwargs):
    """A stand-in for whatever would start heavy work (load a model, play, train, serve)."""
    raise WouldRun


def outcome(argv: list[str], capsys) -> str:
    """'accepted', 'done' (exit 0), 'usage error' or 'error' (one `starpo: error:` line,
    exit 2)."""
    capsys.readouterr()  # forget the previous example's output
    try:
        code = cli.main(argv)
    except WouldRun:
        return "accepted"
    except SystemExit as exit:  # argparse: usage and its error line, exit 2
        assert exit.code == 2, (argv, exit.code)
        assert "Traceback" not in capsys.readouterr().err
        return "usage error"
    err = capsys.readouterr().err
    if code == 0:  # finished (a command whose work is light, e.g. `starpo view RUN`)
        assert "Traceback" not in err, (argv, err)
        return "done"
    assert code == 2, (argv, code, err)
    # `warning: ...` lines (e.g. about the data read so far) may come before the error.
    lines = [line for line in err.strip().splitlines() if not line.startswith("warning: ")]
    assert len(lines) == 1 and lines[0].startswith("starpo: error: "), (argv, err)
    return "error"


WORD = st.text(string.ascii_letters + string.digits + "._-", min_size=1, max_size=12)
VALUE = st.one_of(
    st.integers(-5, 10**6).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.sampled_from(["true", "false", "null", "[]", "{}", "[1, 2", "{a: 1}", "''", "~", "auto"]),
    st.text(string.printable, max_size=12),
)
