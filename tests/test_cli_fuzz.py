"""Fuzzed `starpo train` command lines and config files never end in a traceback.

Hypothesis builds argument lists from real and broken overrides, flags and values, and
config files from random YAML. Every one must either be accepted (the trainer would
start: a stub stands in for it) or stop with one `starpo: error: ...` line and exit 2
(argparse's own usage errors exit 2 as well).
"""

from __future__ import annotations

import string

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from starpo import cli
from starpo.config import config_help, presets


class WouldTrain(Exception):
    """The stub trainer's signal: the command line and config were accepted."""


class StubTrainer:
    def __init__(self, *args, **kwargs):
        raise WouldTrain


KEYS = sorted(row[0] for row in config_help())  # every dotted config key
WORD = st.text(string.ascii_letters + string.digits + "._-", min_size=1, max_size=12)
VALUE = st.one_of(
    st.integers(-5, 10**6).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.sampled_from(["true", "false", "null", "[]", "{}", "[1, 2", "{a: 1}", "''", "~", "auto"]),
    st.text(string.printable, max_size=12),
)
OVERRIDE = st.builds(
    lambda key, value: f"{key}={value}", st.one_of(st.sampled_from(KEYS), WORD), VALUE
)
FLAG = st.sampled_from(
    ["--quiet", "--resume", "--resume=auto", "--resume=latest", "--overwrite", "--bogus", "-x"]
)
ARGS = st.lists(st.one_of(OVERRIDE, FLAG, WORD), max_size=6)
CONFIG_TEXT = st.one_of(
    st.text(string.printable, max_size=60),
    st.dictionaries(
        st.sampled_from([*(k.split(".")[0] for k in KEYS), "base", "nope"]),
        st.one_of(st.dictionaries(WORD, VALUE, max_size=3), VALUE),
        max_size=3,
    ).map(yaml.safe_dump),
)


def _outcome(argv, capsys) -> str:
    capsys.readouterr()  # forget the previous example's output
    try:
        code = cli.main(argv)
    except WouldTrain:
        return "accepted"
    except SystemExit as exit:  # argparse: usage and its error line, exit 2
        assert exit.code == 2, (argv, exit.code)
        assert "Traceback" not in capsys.readouterr().err
        return "usage error"
    err = capsys.readouterr().err
    assert code == 2, (argv, code, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("starpo: error: "), (argv, err)
    return "error"


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(args=ARGS, preset=st.sampled_from([None, *presets(), "no-such-preset"]))
def test_fuzzed_train_command_lines_are_accepted_or_one_line(
    args, preset, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr("starpo.trainer.loop.Trainer", StubTrainer)
    config = [] if preset is None else ["--config", preset]
    _outcome(["train", "--out", str(tmp_path / "run"), *config, *args], capsys)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=CONFIG_TEXT, args=st.lists(OVERRIDE, max_size=2))
def test_fuzzed_config_files_are_accepted_or_one_line(text, args, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("starpo.trainer.loop.Trainer", StubTrainer)
    path = tmp_path / "fuzzed.yaml"
    path.write_text(text, encoding="utf-8")
    _outcome(["train", "--out", str(tmp_path / "run"), "--config", str(path), *args], capsys)
