"""Fuzzed `starpo train` command lines and config files never end in a traceback.

Hypothesis builds argument lists from real and broken overrides, flags and values, and
config files from random YAML. Every one must either be accepted (training would start:
stubs stand in for the memory check, which reads the model's files, and the trainer) or
stop with one `starpo: error: ...` line and exit 2 (argparse's usage errors exit 2 too).
"""

from __future__ import annotations

import string

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli_fuzz_support import VALUE, WORD, outcome, would_run
from starpo.config import config_help, presets

KEYS = sorted(row[0] for row in config_help())  # every dotted config key
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


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(args=ARGS, preset=st.sampled_from([None, *presets(), "no-such-preset"]))
def test_fuzzed_train_command_lines_are_accepted_or_one_line(
    args, preset, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr("starpo.trainer.loop.Trainer", would_run)
    monkeypatch.setattr("starpo.memory.fit.check_fits", would_run)  # reads the model's files
    config = [] if preset is None else ["--config", preset]
    outcome(["train", "--out", str(tmp_path / "run"), *config, *args], capsys)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=CONFIG_TEXT, args=st.lists(OVERRIDE, max_size=2))
def test_fuzzed_config_files_are_accepted_or_one_line(text, args, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("starpo.trainer.loop.Trainer", would_run)
    monkeypatch.setattr("starpo.memory.fit.check_fits", would_run)  # reads the model's files
    path = tmp_path / "fuzzed.yaml"
    path.write_text(text, encoding="utf-8")
    outcome(["train", "--out", str(tmp_path / "run"), "--config", str(path), *args], capsys)
