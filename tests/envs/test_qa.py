"""The QA env: JSONL loading and its errors, lenient numeric and exact verifiers, seeds ->
questions, attempts with feedback, the solver, and the generated arithmetic sets.

tests/envs/data/arithmetic.jsonl is generated; after changing the generator, rewrite it with
    python -c "from starpo.envs.qa.data import arithmetic_jsonl as a; \
open('tests/envs/data/arithmetic.jsonl', 'w').write(a())"
"""

from __future__ import annotations

import json
import os
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from starpo.envs import check_env, make
from starpo.envs.checker import CHECKS
from starpo.envs.policies import make_policy
from starpo.envs.qa.data import (
    ANSWER_CAP,
    arithmetic_jsonl,
    load_records,
    normalize_text,
    number_label,
    numbers_match,
    parse_number,
    seed_index,
    split_answer,
)
from starpo.envs.qa.env import QAEnv
from starpo.errors import UserError

DATA = Path(__file__).parent / "data" / "arithmetic.jsonl"


def write_jsonl(path: Path, rows: list[object]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture
def capitals(tmp_path: Path) -> Path:
    rows = [
        {"q": "Capital of France?", "a": "Paris"},
        {"q": "Capital of Japan?", "a": "Tokyo"},
        {"q": "Largest ocean?", "a": "the Pacific Ocean"},
    ]
    return write_jsonl(tmp_path / "capitals.jsonl", rows)


# --------------------------------------------------------------------------- contract
@pytest.mark.parametrize(
    "kwargs",
    [{}, {"difficulty": 1}, {"difficulty": 3, "attempts": 3}, {"path": str(DATA)}],
)
def test_the_checker_passes(kwargs):
    assert "state keys" in check_env(make("qa", **kwargs))


def test_the_exact_verifier_passes_the_checks_that_apply(capitals):
    # The checker's state-key check steps "definitely-not-an-action" and expects it to be
    # invalid; to an exact verifier it is a well-formed (wrong) answer that uses an attempt.
    env = QAEnv(path=capitals, question_key="q", answer_key="a", verifier="exact", attempts=2)
    for name, check in CHECKS.items():
        if name != "state keys":
            check(env, [0, 1, 2, 10000])


def test_the_same_seed_asks_the_same_question_and_a_file_is_covered_by_n_seeds():
    env = QAEnv(path=DATA)
    questions = [env.reset(seed=seed)[0] for seed in range(50)]
    assert questions == [env.reset(seed=seed)[0] for seed in range(50)]
    assert len(set(questions)) == 50  # seeds 0..n-1 ask every record once
    assert {env.reset(seed=s)[1]["index"] for s in range(10_000, 10_050)} == set(range(50))
    generated = QAEnv()
    assert generated.reset(seed=5)[0] == QAEnv().reset(seed=5)[0] != generated.reset(seed=6)[0]


def test_seed_index_is_a_permutation_that_scatters_neighbours():
    for size in (1, 2, 3, 7, 50, 64, 1319):
        assert sorted(seed_index(s, size) for s in range(size)) == list(range(size))
    assert abs(seed_index(1, 1000) - seed_index(0, 1000)) > 100


def test_options_index_and_unseeded_resets(capitals):
    env = QAEnv(path=capitals, question_key="q", answer_key="a", verifier="exact")
    assert env.reset(options={"index": 2})[0] == "Question: Largest ocean?"
    env.reset(seed=0)
    assert {env.reset()[1]["index"] for _ in range(40)} == {0, 1, 2}
    with pytest.raises(UserError, match="record number 0..2"):
        env.reset(options={"index": 3})


# ------------------------------------------------------------------- episodes, rewards
def test_a_right_answer_scores_one_and_ends_the_episode():
    env = QAEnv(path=DATA)
    env.reset(options={"index": 2})
    assert env.record.question == "What is (91 + 51) * 8 - 97?"
    obs, reward, terminated, truncated, info = env.step(" The answer is 1,039. ")
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert info["success"] and info["correct"] and info["action"] == "1039"
    assert obs.endswith("\nYour answer 1039 is correct.")


def test_attempts_give_feedback_and_a_retry():
    env = QAEnv(path=DATA, attempts=3)
    obs, _ = env.reset(options={"index": 0})
    assert obs == "Question: What is 64 * 7?"
    assert "You have 3 attempts" in env.instruction
    key = env.state_key()
    obs, reward, terminated, truncated, info = env.step("447")
    assert obs == "Question: What is 64 * 7?\nYour answer 447 is not correct. Try again."
    assert (reward, terminated, truncated, info["action_is_valid"]) == (0.0, False, False, True)
    assert env.state_key() == (key[0], 1) != key
    assert env.optimal_success_probability() == 1.0
    assert env.step("448.0")[1:3] == (1.0, True)
    assert env.is_success() and env.optimal_action() is None


def test_running_out_of_attempts_truncates_without_success():
    env = QAEnv(difficulty=1, attempts=2)
    env.reset(seed=3)  # 10 * 3
    env.step("29")
    obs, reward, terminated, truncated, info = env.step("31")
    assert obs.endswith("Your answer 31 is not correct.")  # no "Try again" at the end
    assert (reward, terminated, truncated, info["success"]) == (0.0, False, True, False)
    assert env.optimal_success_probability() == 0.0


def test_wrong_answers_before_share_the_state_key():
    keys = []
    for wrong in ("1", "2"):
        env = QAEnv(attempts=3)
        env.reset(seed=9)
        env.step(wrong)
        keys.append(env.state_key())
    assert keys[0] == keys[1]


# ------------------------------------------------------------------------- verifiers
@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("72", 72),
        ("72.0", 72),
        ("$72", 72),
        ("1,234", 1234),
        ("72 dollars", 72),
        ("-3.5", Fraction(-7, 2)),
        ("\u22124", -4),
        ("3/4", Fraction(3, 4)),
        ("\\frac{3}{4}", Fraction(3, 4)),
        ("\\boxed{12}", 12),
        ("So 5 + 7 = 12.", 12),
        ("50%", 50),
        ("1.5e3", 1500),
        ("2E-1", Fraction(1, 5)),
        ("e5 or 7", 7),
        ("1e99999999", Fraction(10**999)),  # at most 3 exponent digits: no huge powers
        (".5", Fraction(1, 2)),
        ("no number here", None),
        ("3/0", None),
    ],
)
def test_numbers_are_read_leniently_the_last_one_counting(text, value):
    assert parse_number(text) == value


def test_number_labels_are_canonical():
    values = ("72", "-3.5", "3/4", "-0.05", "1/3", "1/128", "1e-7")
    labels = [number_label(Fraction(v)) for v in values]
    assert labels == ["72", "-3.5", "0.75", "-0.05", "1/3", "1/128", "1/10000000"]
    huge = "9" * 400 + ".5"  # beyond a float's range: still exact, never an OverflowError
    assert number_label(parse_number(huge)) == huge


def test_the_numeric_verifier_has_a_relative_tolerance(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"question": "1/3?", "answer": "1/3"}])
    env = QAEnv(path=path, attempts=3)
    env.reset(seed=0)
    assert env.step("0.33")[1] == 0.0
    assert env.step("0.333333")[1] == 1.0  # within 1e-6 of 1/3
    big = write_jsonl(tmp_path / "b.jsonl", [{"question": "?", "answer": "1000000000"}])
    env = QAEnv(path=big)
    env.reset(seed=0)
    assert env.step("1000000001")[1] == 1.0  # relative, not absolute


def test_the_numeric_verifier_is_exact_beyond_a_floats_range():
    # Found by hypothesis: the float tolerance times Fraction("1E400") overflowed.
    assert not numbers_match(parse_number("1E400"), Fraction(3))
    assert numbers_match(parse_number("1E400"), Fraction(10**400) + 1)
    assert number_label(parse_number("1E500")) == "1e500"  # a label too long reads back


def test_the_exact_verifier_normalises_case_spaces_and_a_final_period(capitals):
    env = QAEnv(path=capitals, question_key="q", answer_key="a", verifier="exact", attempts=4)
    env.reset(options={"index": 2})
    assert env.answer_format == "the exact answer text"
    assert env.step("Pacific")[1] == 0.0
    obs, reward, *_, info = env.step("  The  PACIFIC ocean. ")
    assert reward == 1.0 and info["action"] == "The PACIFIC ocean."
    assert normalize_text(" A  b. ") == "a b"


@pytest.mark.parametrize("bad", ["", "  \n", None, 72, b"72", "x" * (ANSWER_CAP + 1), "many"])
def test_invalid_answers_change_nothing_and_use_no_attempt(bad):
    env = QAEnv(attempts=2)
    obs, _ = env.reset(seed=1)
    before = (env.snapshot(), env.steps_left)
    obs_after, reward, terminated, truncated, info = env.step(bad)
    assert not info["action_is_valid"] and info["action"] is None
    assert (obs_after, reward, terminated, truncated) == (obs, 0.0, False, False)
    assert (env.snapshot(), env.steps_left) == before


@settings(max_examples=150, deadline=None)
@given(text=st.one_of(st.text(max_size=60), st.from_regex(r"[-$\\{}/.,e0-9 ]{0,40}")))
def test_any_text_is_judged_without_raising(text):
    env = QAEnv(attempts=2)
    env.reset(seed=4)
    before = (env.render(), env.snapshot())
    *_, info = env.step(text)
    if info["action_is_valid"]:
        assert env.parse_action(info["action"]) == env.parse_action(text)  # labels re-read
    else:
        assert (env.render(), env.snapshot()) == before


def test_a_wordy_answer_is_valid_for_the_exact_verifier(capitals):
    env = QAEnv(path=capitals, question_key="q", answer_key="a", verifier="exact")
    env.reset(seed=0)
    assert env.step("many")[4]["action_is_valid"]


# --------------------------------------------------------------------- solver, baseline
def play(env: QAEnv, policy, seeds) -> float:
    wins = 0
    for seed in seeds:
        env.reset(seed=seed)
        while not env.done:
            env.step(policy(env))
        wins += env.is_success()
    return wins / len(seeds)


@pytest.mark.parametrize(
    "kwargs", [{}, {"difficulty": 1}, {"difficulty": 3}, {"path": str(DATA), "attempts": 2}]
)
def test_the_solver_answers_every_question_and_random_rarely(kwargs):
    env = QAEnv(**kwargs)
    assert play(env, make_policy("solver"), range(200)) == 1.0
    assert play(env, make_policy("random", seed=1), range(200)) < 0.1


def test_the_exact_solver_and_random_answers_from_the_dataset(capitals):
    env = QAEnv(path=capitals, question_key="q", answer_key="a", verifier="exact")
    assert play(env, make_policy("solver"), range(30)) == 1.0
    rng = np.random.default_rng(0)
    assert {env.sample_action(rng) for _ in range(30)} == {"Paris", "Tokyo", "the Pacific Ocean"}


def test_rationales_quote_short_working_only_for_the_right_answer():
    env = QAEnv(path=DATA)
    env.reset(options={"index": 2})
    assert env.explain("1039") == (
        "91 + 51 = 142, 142 * 8 = 1136, 1136 - 97 = 1039. So I answer 1039."
    )
    assert env.explain("1038") is None and env.explain("") is None


def test_gsm8k_calculator_notes_are_dropped_from_rationales(tmp_path):
    answer = "She sold 48/2 = <<48/2=24>>24 clips in May.\n#### 72"
    path = write_jsonl(tmp_path / "g.jsonl", [{"question": "How many?", "answer": answer}])
    env = QAEnv(path=path)
    env.reset(seed=0)
    assert env.explain("72") == "She sold 48/2 = 24 clips in May. So I answer 72."


# ------------------------------------------------------------------------------ data
def test_the_shipped_set_is_the_generators_output():
    assert DATA.read_text() == arithmetic_jsonl()
    rows = [json.loads(line) for line in DATA.read_text().splitlines()]
    assert len(rows) == 50 and all("\n#### " in row["answer"] for row in rows)


def test_answers_split_at_hashes_or_the_answer_is():
    assert split_answer("a = 3\nb = 4\n#### 72") == ("a = 3\nb = 4", "72")
    assert split_answer("So 3 + 4 = 7. The answer is: 7") == ("So 3 + 4 = 7.", "7")
    assert split_answer(" 42 ") == ("", "42")


def test_json_numbers_other_keys_and_limit(tmp_path):
    rows = [{"query": f"q{i}?", "response": i * 10, "extra": 1} for i in range(5)]
    path = write_jsonl(tmp_path / "m.jsonl", rows)
    env = make("qa", path=str(path), question_key="query", answer_key="response", limit=3)
    assert len(env.records) == 3 and env.records[2].answer == "20"


def test_a_relative_path_is_read_from_the_working_directory(tmp_path, monkeypatch):
    write_jsonl(tmp_path / "rel.jsonl", [{"question": "2+2?", "answer": "4"}])
    monkeypatch.chdir(tmp_path)
    assert make("qa", path="rel.jsonl").reset(seed=0)[0] == "Question: 2+2?"


def test_records_are_loaded_once_per_file_version(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", [{"question": "1?", "answer": "1"}])
    assert QAEnv(path=path).records is QAEnv(path=path).records
    write_jsonl(path, [{"question": "2?", "answer": "2"}, {"question": "3?", "answer": "3"}])
    os.utime(path, ns=(1, 1))  # a new modification time, even on coarse clocks
    assert len(QAEnv(path=path).records) == 2


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "has no records"),
        ("\n  \n", "has no records"),
        ('{"question": "a", "answer": "1"}\n{"question": "b",\n', r"c\.jsonl:2: not valid JSON"),
        ("[1, 2]\n", "a JSON list, not an object"),
        (
            '{"q": "a", "answer": "1"}\n',
            "no 'question' key .keys: 'q', 'answer'.; set question_key",
        ),
        ('{"question": "a", "answer": ""}\n', "'answer' must be non-empty text"),
        ('{"question": "a", "answer": "many"}\n', "has no number; fix the line or use verifier"),
        ('{"question": "a", "answer": "work\\n####  "}\n', "after '####' is empty"),
    ],
)
def test_bad_files_are_user_errors_naming_the_problem(tmp_path, content, message):
    path = tmp_path / "c.jsonl"
    path.write_text(content)
    with pytest.raises(UserError, match=message):
        QAEnv(path=path)


def test_a_missing_file_names_its_path_and_a_non_utf8_line_its_number(tmp_path):
    with pytest.raises(UserError, match="'data/gsm8k.jsonl' not found .resolved to /"):
        make("qa", path="data/gsm8k.jsonl")
    path = tmp_path / "latin.jsonl"
    path.write_bytes(b'{"question": "a", "answer": "1"}\n{"question": "\xe9"}\n')
    with pytest.raises(UserError, match="latin.jsonl:2: not UTF-8"):
        load_records(path, "question", "answer", True, None)


def test_an_over_long_exact_answer_is_refused(tmp_path):
    path = write_jsonl(tmp_path / "x.jsonl", [{"question": "?", "answer": "y" * 600}])
    with pytest.raises(UserError, match="600 characters"):
        QAEnv(path=path, verifier="exact")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"attempts": 0}, "attempts must be a whole number from 1 to 20"),
        ({"attempts": 2.0}, "attempts"),
        ({"attempts": True}, "attempts"),
        ({"verifier": "fuzzy"}, "verifier must be 'numeric' or 'exact'"),
        ({"question_key": ""}, "question_key must be a non-empty field name"),
        ({"difficulty": 4}, "difficulty must be a whole number from 1 to 3"),
        ({"limit": 5}, "limit applies to a data file"),
        ({"path": str(DATA), "difficulty": 1}, "difficulty applies to the generated set"),
        ({"path": str(DATA), "limit": 0}, "limit must be a whole number of at least 1"),
        ({"path": 7}, "path must be a JSONL file's path"),
        ({"path": str(DATA.parent)}, "is not a file"),
    ],
)
def test_bad_arguments_are_user_errors(kwargs, message):
    with pytest.raises(UserError, match=message):
        QAEnv(**kwargs)


@pytest.mark.parametrize("text", ["1E-500", "-3E-700", "2.5E-600"])
def test_a_tiny_number_reads_back_from_its_label(text):
    # Was "1/1000...0" (501 digits): longer than an answer may be, so it read back as None.
    from starpo.envs.qa.data import number_label, parse_number

    value = parse_number(text)
    assert value is not None and parse_number(number_label(value)) == value
