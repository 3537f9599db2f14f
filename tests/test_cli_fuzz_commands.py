"""Fuzzed command lines of `starpo eval`, `sft`, `view`, `report`, `check-env` and `play`
never end in a traceback (`starpo train`'s are in test_cli_fuzz.py).

Hypothesis builds argument lists from each command's real flags with valid and broken
values (negative, huge and NaN numbers, nonsense env ids and env arguments, unknown flags,
random words) and from paths to prepared folders: a real eval folder and run folder,
copies of them whose files Hypothesis corrupts, an empty folder, a plain file, a path
under a file, a missing path. Every command line must be accepted, finish (`starpo view`
without --serve) or stop with one `starpo: error: ...` line and exit 2 (see
cli_fuzz_support.outcome).

Where heavy work would start, a stub raises `WouldRun` instead: playing an episode
(`run_episode`), converting the default model, probing the model hub or reading a
model's files, running the env checker, the interactive game, serving the viewer page,
drawing report figures. Everything before it, argument checks, env construction, config
and file reading, runs for real.
"""

from __future__ import annotations

import importlib
import json
import shutil
import string
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from cli_fuzz_support import VALUE, WORD, outcome, would_run
from starpo import cli
from starpo.config import presets
from starpo.envs import registered_ids, spec
from starpo.envs.registry import accepted_kwargs
from starpo.rollout.engine import EpisodeSettings
from starpo.sft.options import TrainOptions
from starpo.types import Trajectory, Turn

FUZZ = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

# ---- values ---------------------------------------------------------------------------

# Mostly values that argparse takes (fine ones and out-of-range ones), so that most command
# lines reach the command; now and then one that argparse itself refuses.
SMALL = st.integers(0, 8).map(str)
BAD_INT = st.sampled_from(["-1", "-1000000", "1000000", str(2**63), str(2**64), "1e3", "", "x"])
INT = st.one_of(SMALL, SMALL, BAD_INT)
BAD_FLOAT = st.sampled_from(["-1", "-0.0", "1e-9", "1e400", "nan", "inf", "-inf", "", "x"])
FLOAT = st.one_of(st.floats(0, 2).map(str), st.floats().map(str), BAD_FLOAT)
ENV_ID = st.one_of(
    st.sampled_from(registered_ids()),
    st.sampled_from([*registered_ids(), "nope", "", "Bandit", "sokoban ", "frozen-lake"]),
    WORD,
)
# Every registered env's constructor arguments (one of another env is a one-line error).
# Building an env is cheap whatever the numbers; a reset, which a huge size makes slow,
# happens only behind the stubs.
ENV_KEYS = sorted({k for i in registered_ids() for k in accepted_kwargs(spec(i).load()) or []})
ENV_VALUE = st.one_of(
    st.integers(-2, 9).map(str),
    st.sampled_from(["nan", "-inf", "0.5", "1e400", "[6, 6]", "[1, 2", "[SFF, FHF, FFG]"]),
    st.sampled_from(["standard", "{a: 1}", "null", "true", "''", "|", ": x", "!!python/none"]),
    VALUE,
)
ENV_ARG = st.one_of(
    st.builds(lambda k, v: f"{k}={v}", st.sampled_from(ENV_KEYS) | WORD, ENV_VALUE),
    st.sampled_from(["=", "size", "=3", "size=", "a=b=c"]),
)
EXTRA = st.one_of(st.sampled_from(["--bogus", "-x", "--", "-", "--help=no"]), WORD)

# Folders and files, as placeholders that `_place` turns into paths in a fresh folder.
PATH = st.sampled_from(
    ["@missing", "@empty", "@file", "@eval", "@run", "@bad-eval", "@bad-run", "@under-file"]
)
MODEL = st.one_of(
    st.sampled_from(["smollm2-135m-instruct", "@model", "@empty", "@file", "@missing", "./x"]),
    WORD,
)


def _option(flag: str, value: st.SearchStrategy[str]) -> st.SearchStrategy[list[str]]:
    return value.map(lambda v: [flag, v])


def _command_line(
    options: dict[str, st.SearchStrategy[str] | None], max_size: int = 7
) -> st.SearchStrategy[list[str]]:
    """Flags in any order and number, each with a value drawn from its strategy (None: a
    switch), mixed with unknown flags and stray words."""
    parts = [st.just([f]) if v is None else _option(f, v) for f, v in options.items()]
    extra = st.one_of(st.just([]), st.just([]), st.just([]), EXTRA.map(lambda e: [e]))
    return st.builds(
        lambda lists, extra: [a for part in lists for a in part] + extra,
        st.lists(st.one_of(*parts), max_size=max_size),
        extra,
    )


def _settings_options(names: list[str]) -> dict[str, st.SearchStrategy[str] | None]:
    """The flags of `EpisodeSettings` fields: --think/--no-think, typed values otherwise."""
    options: dict[str, st.SearchStrategy[str] | None] = {}
    for name, f in EpisodeSettings.model_fields.items():
        if name not in names:
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(f.default, bool):
            options[flag] = None
            options["--no-" + flag[2:]] = None
        else:
            options[flag] = INT if isinstance(f.default, int) else FLOAT
    return options


SETTINGS = list(EpisodeSettings.model_fields)
EVAL_OPTIONS = {
    "--env": ENV_ID,
    "--policy": st.sampled_from(["random", "solver", "model", "oracle"]),
    "--episodes": INT,
    "--out": PATH,
    "--seed-start": INT,
    "--env-arg": ENV_ARG,
    "--quiet": None,
    "--model": MODEL,
    "--device": st.sampled_from(["cpu", "cuda", "cuda:7", "mps", "tpu", "", "cpu:-1"]),
    "--backend": st.sampled_from(["auto", "hf", "lean", "auto", "hf", "lean", "vllm"]),
    "--dtype": st.sampled_from(["auto", "fp32", "bf16", "auto", "fp32", "bf16", "fp16"]),
    "--samples-per-seed": INT,
    "--batch-size": INT,
    **_settings_options(SETTINGS),
}
SFT_TRAINING = {
    "--" + name.replace("_", "-"): (
        st.sampled_from(["constant", "cosine", "linear"])
        if name == "schedule"
        else st.sampled_from(["auto", "fp32", "bf16", "fp16"])
        if name == "dtype"
        else INT
        if isinstance(default, int)
        else FLOAT
    )
    for name, default in ((n, f.default) for n, f in TrainOptions.model_fields.items())
}
SFT_OPTIONS = {
    "--out": PATH,
    "--model": MODEL,
    "--config": st.sampled_from([*presets(), "no-such-preset", "@file", "@empty", "@missing"]),
    "--device": st.sampled_from(["cpu", "cuda", "tpu", ""]),
    "--quiet": None,
    "--from-solver": INT,
    "--env": ENV_ID,
    "--seed-start": INT,
    "--env-arg": ENV_ARG,
    "--actions-per-turn": INT,
    "--only-success": None,
    "--no-only-success": None,
    **_settings_options(
        ["max_turns", "max_actions_per_turn", "max_actions_per_traj", "max_new_tokens"]
        + ["max_response_words", "think", "stop_at_answer"]
    ),
    **SFT_TRAINING,
}

# ---- files: real ones, and corrupted copies -----------------------------------------------


def _trajectory(seed: int) -> Trajectory:
    turn = Turn(
        state="#####\n#P.G#\n#####",
        response="<think>go</think><answer>Right</answer>",
        think="go",
        actions=["Right"],
        executed=["right"],
        format_ok=True,
        env_reward=1.0,
        reward=1.0,
        num_valid=1,
        num_effective=1,
        response_tokens=4,
    )
    return Trajectory(
        env_id="sokoban",
        seed=seed,
        group=seed,
        messages=[{"role": "user", "content": "play"}],
        turns=[turn],
        token_ids=[1, 2, 3, 4],
        loss_mask=[0, 1, 1, 1],
        logprobs=[0.0, -0.5, -0.5, -0.5],
        turn_ends=[4],
        success=True,
        done=True,
    )


METRICS = [
    {"step": s, "train/bandit/success": s / 4, "actor/entropy": 1.0, "actor/grad_norm": None}
    for s in range(1, 4)
]
ALERTS = [{"step": 2, "severity": "warning", "rule": "entropy_drop", "message": "fell"}]


@pytest.fixture(scope="module")
def templates(tmp_path_factory) -> Path:
    """`eval/` (a real `starpo eval` folder), `run/` (a training run's files), `model/`."""
    root = tmp_path_factory.mktemp("fuzz-templates")
    argv = ["eval", "--env", "bandit", "--policy", "random", "--episodes", "3", "--quiet"]
    assert cli.main([*argv, "--out", str(root / "eval")]) == 0
    run = root / "run"
    (run / "trajectories").mkdir(parents=True)
    (run / "trajectories" / "step_000001.jsonl").write_text(
        "".join(_trajectory(s).to_json() + "\n" for s in (100_000, 100_001)), encoding="utf-8"
    )
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in METRICS))
    (run / "alerts.jsonl").write_text("".join(json.dumps(a) + "\n" for a in ALERTS))
    (root / "model").mkdir()
    (root / "model" / "config.json").write_text("{}")
    return root


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=6,
)
RECORDS = [
    *(_trajectory(s).to_json() for s in (1, 2)),
    *(json.dumps(m) for m in METRICS + ALERTS),
    json.dumps(
        {
            "env_id": "bandit",
            "seed": 5,
            "policy": "random",
            "initial_observation": "start",
            "steps": [
                {
                    "action": "Dragon",
                    "observation": "won",
                    "reward": 1.0,
                    "terminated": True,
                    "truncated": False,
                    "action_is_valid": True,
                    "action_is_effective": True,
                }
            ],
            "success": True,
        }
    ),
]


@st.composite
def broken_record(draw) -> str:
    """A real record with one value, somewhere inside it, replaced or removed."""
    record = json.loads(draw(st.sampled_from(RECORDS)))
    node = record
    for _ in range(draw(st.integers(0, 3))):  # go down a few levels
        children = list(node) if isinstance(node, dict) else range(len(node))
        key = draw(st.sampled_from(children)) if children else None
        if key is None or not isinstance(node[key], dict | list) or not node[key]:
            break
        node = node[key]
    children = list(node) if isinstance(node, dict) else list(range(len(node)))
    if children:
        key = draw(st.sampled_from(children))
        if draw(st.booleans()) and isinstance(node, dict):
            del node[key]
        else:
            node[key] = draw(JSON)
    return json.dumps(record)


LINE = st.one_of(st.sampled_from(RECORDS), broken_record(), JSON.map(json.dumps))
BAD_TEXT = st.one_of(
    st.lists(LINE, min_size=1, max_size=3).map(lambda lines: "".join(x + "\n" for x in lines)),
    st.builds(lambda text, cut: text[:cut], st.sampled_from(RECORDS), st.integers(0, 400)),
    st.text(string.printable, max_size=40),
    st.binary(max_size=20).map(lambda b: b.decode("latin-1")),
)


def _place(argv: list[str], templates: Path, bad_text: str, base: Path) -> list[str]:
    """`argv` with each "@name" replaced by the path of a fresh `base/name`."""
    shutil.copytree(templates / "eval", base / "eval")
    shutil.copytree(templates / "run", base / "run")
    shutil.copytree(templates / "model", base / "model")
    (base / "empty").mkdir()
    (base / "file").write_text("not a folder\n")
    shutil.copytree(base / "eval", base / "bad-eval")
    (base / "bad-eval" / "trajectories.jsonl").write_text(bad_text, encoding="utf-8")
    (base / "bad-eval" / "summary.json").write_text(bad_text, encoding="utf-8")
    shutil.copytree(base / "run", base / "bad-run")
    for name in ("metrics.jsonl", "alerts.jsonl", "trajectories/step_000001.jsonl"):
        (base / "bad-run" / name).write_text(bad_text, encoding="utf-8")
    names = {"@under-file": "file/sub"}
    return [str(base / names.get(a, a[1:])) if a.startswith("@") else a for a in argv]


@pytest.fixture
def stubs(monkeypatch):
    """Stubs where heavy work would start; everything before them runs for real."""
    # eval, sft --from-solver:
    monkeypatch.setattr("starpo.evaluation.scripted.run_episode", would_run)
    monkeypatch.setattr("starpo.models.loading.ensure_default_model", would_run)
    monkeypatch.setattr("starpo.models.loading.hub_reachable", would_run)
    monkeypatch.setattr("starpo.models.loading._cached_tokenizer", would_run)
    monkeypatch.setattr("starpo.envs.check_env", would_run)
    monkeypatch.setattr("starpo.cli.play.play_interactive", would_run)
    # (`starpo.viewer.http` names the function that the package exports, not the module)
    monkeypatch.setattr(importlib.import_module("starpo.viewer.http"), "_serve", would_run)
    monkeypatch.setattr("starpo.viewer.report.build_figure", would_run)


def _run(argv, templates, bad_text, tmp_path, capsys, monkeypatch) -> str:
    base = Path(tempfile.mkdtemp(dir=tmp_path))  # a fresh folder per example
    monkeypatch.chdir(base)  # `starpo report RUN_A RUN_B` writes ./report-compare
    result = outcome(_place(argv, templates, bad_text, base), capsys)
    event(result)  # how often each outcome came up: pytest --hypothesis-show-statistics
    return result


# ---- the commands -----------------------------------------------------------------------


@FUZZ
@given(
    required=st.fixed_dictionaries(
        {"--env": ENV_ID, "--policy": st.sampled_from(["random", "solver", "model"]), "--out": PATH}
    ),
    args=_command_line(EVAL_OPTIONS),
    bad_text=BAD_TEXT,
)
def test_fuzzed_eval_command_lines(
    required, args, bad_text, templates, stubs, tmp_path, capsys, monkeypatch
):
    argv = ["eval", *(a for pair in required.items() for a in pair), *args]
    _run(argv, templates, bad_text, tmp_path, capsys, monkeypatch)


@FUZZ
@given(
    data=st.lists(st.one_of(st.just("@eval"), PATH), max_size=3),
    out=PATH,
    args=_command_line(SFT_OPTIONS),
    bad_text=BAD_TEXT,
)
def test_fuzzed_sft_command_lines(
    data, out, args, bad_text, templates, stubs, tmp_path, capsys, monkeypatch
):
    argv = ["sft", *data, "--out", out, *args]
    _run(argv, templates, bad_text, tmp_path, capsys, monkeypatch)


@FUZZ
@given(
    run=st.one_of(st.sampled_from(["@eval", "@run"]), PATH),
    args=_command_line({"--serve": None, "--port": INT}, max_size=4),
    bad_text=BAD_TEXT,
)
def test_fuzzed_view_command_lines(
    run, args, bad_text, templates, stubs, tmp_path, capsys, monkeypatch
):
    _run(["view", run, *args], templates, bad_text, tmp_path, capsys, monkeypatch)


@FUZZ
@given(
    runs=st.lists(st.one_of(st.just("@run"), PATH), min_size=1, max_size=3),
    args=_command_line(
        {"--out": PATH, "--x": st.one_of(st.sampled_from(["steps", "minutes"]), VALUE)},
        max_size=3,
    ),
    bad_text=BAD_TEXT,
)
def test_fuzzed_report_command_lines(
    runs, args, bad_text, templates, stubs, tmp_path, capsys, monkeypatch
):
    _run(["report", *runs, *args], templates, bad_text, tmp_path, capsys, monkeypatch)


@FUZZ
@given(
    command=st.sampled_from(["check-env", "play"]),
    env_id=ENV_ID,
    args=_command_line({"--env-arg": ENV_ARG, "--seed": INT}, max_size=5),
)
def test_fuzzed_check_env_and_play_command_lines(
    command, env_id, args, templates, stubs, tmp_path, capsys, monkeypatch
):
    _run([command, env_id, *args], templates, "", tmp_path, capsys, monkeypatch)


# ---- inputs the fuzz found: each was a traceback, a second stderr line or silently taken -----


def _error_line(argv: list[str], capsys) -> str:
    """The one stderr line of a command line that must stop with exit code 2."""
    capsys.readouterr()
    assert cli.main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("starpo: error: "), lines
    return lines[0]


@pytest.fixture
def folders(templates, tmp_path) -> Path:
    """tmp_path with `eval/`, `run/` (copies of the templates) and `file`, a plain file."""
    shutil.copytree(templates / "eval", tmp_path / "eval")
    shutil.copytree(templates / "run", tmp_path / "run")
    (tmp_path / "file").write_text("not a folder\n")
    return tmp_path


EVAL = ["eval", "--env", "bandit", "--policy"]
SOLVER_SFT = ["sft", "--from-solver", "2", "--env", "bandit", "--out"]


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["play", "bandit", "--seed", "-1"], "--seed must be between 0 and"),
        ([*EVAL, "random", "--out", "{tmp}/e", "--seed-start", "-5"], "--seed-start must be"),
        ([*SOLVER_SFT, "{tmp}/s", "--seed-start", "-5"], "--seed-start must be between 0"),
        ([*SOLVER_SFT, "{tmp}/s", "--seed", str(2**64)], "--seed must be between 0 and"),
    ],
)
def test_a_negative_or_huge_seed_is_one_line(argv, expected, stubs, tmp_path, capsys):
    # Was numpy's "ValueError: expected non-negative integer" (torch's "Overflow when
    # unpacking long long" for --seed 2**64, after the model had loaded).
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert expected in _error_line(argv, capsys)


@pytest.mark.parametrize(
    "argv",
    [
        [*EVAL, "random", "--out", "{tmp}/file"],
        [*EVAL, "random", "--out", "{tmp}/file/sub"],
        [*EVAL, "model", "--out", "{tmp}/file"],
        [*SOLVER_SFT, "{tmp}/file"],
        ["report", "{tmp}/run", "--out", "{tmp}/file/sub"],
    ],
)
def test_an_out_folder_that_cannot_be_made_is_one_line_before_any_work(
    argv, stubs, folders, capsys
):
    # Was FileExistsError / NotADirectoryError after every episode was played (`starpo sft`:
    # after training). The stubs raise WouldRun if an episode or a model started first.
    argv = [a.replace("{tmp}", str(folders)) for a in argv]
    line = _error_line(argv, capsys)
    assert "cannot write the" in line and "choose another --out" in line


@pytest.mark.parametrize(
    "argv",
    [
        ["check-env", "sokoban"],
        ["play", "sokoban"],
        [*EVAL, "random", "--out", "{tmp}/e"],
        [*SOLVER_SFT, "{tmp}/s"],
    ],
)
def test_an_env_arg_that_is_not_yaml_is_one_line(argv, stubs, tmp_path, capsys):
    # Was yaml's ParserError with a multi-line traceback.
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv] + ["--env-arg", "dim_room=[6,6"]
    assert "--env-arg 'dim_room=[6,6': '[6,6' is not a YAML value" in _error_line(argv, capsys)


@pytest.mark.parametrize(
    "args", [["--env", "nope", "--policy", "model"], [*EVAL[1:], "model", "--model", "./nope"]]
)
def test_an_eval_that_stops_before_its_model_loads_draws_no_progress_bar(
    args, stubs, tmp_path, capsys
):
    # The empty bar "eval nope:   0%| | 0/100" came before the error line on stderr.
    _error_line(["eval", *args, "--out", str(tmp_path / "e")], capsys)


def test_the_eval_progress_bar_opens_at_the_first_turn(capsys):
    from starpo.evaluation.model import EvalProgress, progress_bar

    bar, show = progress_bar(4, "eval bandit")
    with bar:
        assert capsys.readouterr().err == ""  # the model is loading
        show(EvalProgress(1, 5, 0, 12, 0.5))
        assert "eval bandit" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, expected",
    [
        (["random", "--episodes", str(2**63)], "--episodes must be between 1 and 1000000"),
        (["model", "--episodes", "2", "--samples-per-seed", str(10**6)], "at most 1000000"),
    ],
)
def test_too_many_eval_episodes_is_one_line(args, expected, stubs, tmp_path, capsys):
    # Was OverflowError ("cannot fit 'int' into an index-sized integer") for 2**63.
    assert expected in _error_line([*EVAL, *args, "--out", str(tmp_path / "e")], capsys)


@pytest.mark.parametrize("port", ["-1", "65536"])
def test_a_port_out_of_range_is_one_line(port, stubs, folders, capsys):
    # Was OverflowError: bind(): port must be 0-65535.
    line = _error_line(["view", str(folders / "eval"), "--serve", "--port", port], capsys)
    assert f"--port must be between 0 and 65535 (0: any free port), got {port}" in line


def test_a_port_in_use_is_one_line(folders, capsys):
    import socket

    with socket.socket() as taken:  # the real server tries, and fails, to bind this port
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        line = _error_line(["view", str(folders / "eval"), "--serve", "--port", port], capsys)
    assert f"cannot serve on 127.0.0.1:{port}" in line and "choose another --port" in line


@pytest.mark.parametrize(
    "flag, value", [("--lr", "inf"), ("--weight-decay", "nan"), ("--max-grad-norm", "nan")]
)
def test_sft_options_that_are_not_finite_are_one_line(flag, value, stubs, folders, capsys):
    # Were taken: training would have run with NaN or infinite weights.
    argv = ["sft", str(folders / "eval"), "--out", str(folders / "s"), flag, value]
    assert f"{flag} must be a finite number" in _error_line(argv, capsys)


@pytest.mark.parametrize("count", ["-3", str(10**11)])
def test_a_solver_episode_count_out_of_range_is_one_line(count, stubs, tmp_path, capsys):
    # 10**11 played solver episodes for days; -3 played none without a word.
    argv = ["sft", "--from-solver", count, "--env", "bandit", "--out", str(tmp_path / "s")]
    assert "--from-solver must be between 0 and 1000000" in _error_line(argv, capsys)


def test_a_training_seed_beyond_torchs_range_is_one_line(tmp_path, capsys):
    # torch.manual_seed(2**64) raised "Overflow when unpacking long long" after the model loaded.
    argv = ["train", "--out", str(tmp_path / "r"), f"trainer.seed={2**64}"]
    assert "trainer.seed must be >= 0 and <= 9223372036854775807" in _error_line(argv, capsys)
