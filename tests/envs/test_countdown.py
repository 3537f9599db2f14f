"""Countdown: exact answer parsing without eval(), solvable levels, rewards, retries, solver."""

from __future__ import annotations

import time
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest

from starpo.envs import check_env, make
from starpo.envs.countdown.env import CountdownEnv
from starpo.envs.countdown.solver import parse_answer, solve
from starpo.envs.policies import make_policy
from starpo.errors import UserError


def level_env(numbers: list[int], target: int, **kwargs) -> CountdownEnv:
    env = CountdownEnv(**kwargs)
    env.reset(options={"numbers": numbers, "target": target})
    return env


# ------------------------------------------------------------------------ checker
@pytest.mark.parametrize(
    "kwargs",
    [{}, {"attempts": 4}, {"num_numbers": 2, "ops": "+-"}, {"num_numbers": 5, "max_target": 999}],
)
def test_checker_passes(kwargs):
    assert "determinism" in check_env(CountdownEnv(**kwargs))


def test_registered_ids():
    single, multi = make("countdown"), make("countdown-multi")
    assert (single.max_steps, single.format_score) == (1, 0.1)
    assert (multi.max_steps, multi.format_score) == (4, 0.0)
    assert "4 attempts" in multi.instruction and "attempts" not in single.instruction


# ------------------------------------------------------------------------ parsing
@pytest.mark.parametrize(
    ("text", "label", "numbers", "value"),
    [
        ("(3+5)*2", "(3+5)*2", (2, 3, 5), Fraction(16)),
        ("  ( 3 + 5 ) * 2 \n", "(3+5)*2", (2, 3, 5), Fraction(16)),
        ("(3+5)*3 = 24", "(3+5)*3", (3, 3, 5), Fraction(24)),  # a claimed result is dropped
        ("(3+5)*2 = 99", "(3+5)*2", (2, 3, 5), Fraction(16)),  # ... even a false one
        ("3 × 5 ÷ 2 − 1", "3*5/2-1", (1, 2, 3, 5), Fraction(13, 2)),
        ("-3+5+7", "-3+5+7", (3, 5, 7), Fraction(9)),  # RAGEN's own answer form
        ("8/3*3", "8/3*3", (3, 3, 8), Fraction(8)),  # exact: no float rounding
        ("5/(3-3)", "5/(3-3)", (3, 3, 5), None),  # well formed, divides by zero
        ("24", "24", (24,), Fraction(24)),
        ("(" * 99 + "1" + ")" * 99, "(" * 99 + "1" + ")" * 99, (1,), Fraction(1)),  # 199 chars
    ],
)
def test_well_formed_answers(text, label, numbers, value):
    answer = parse_answer(text)
    assert (answer.text, answer.numbers, answer.value) == (label, numbers, value)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        None,
        24,
        b"3+5",
        "3**2",
        "7//2",
        "2.5*2",
        "0x10",
        "1_000",
        "abs(3)",
        "x+1",
        "3+",
        "+3",
        "(3)(5)",
        "3,5",
        "3 5",
        "05+1",
        "True",
        "3+5 = 8 = 8",
        "= 24",
        "<answer>3+5</answer>",
        "1+" * 100 + "1",  # over 200 characters
        "(" * 100 + "1" + ")" * 100,  # 201 characters
        "9" * 10_000,
    ],
)
def test_unreadable_answers_are_none(text):
    assert parse_answer(text) is None


def test_huge_input_is_rejected_fast():
    start = time.perf_counter()
    for text in ("1+" * 500_000 + "1", "(" * 100_000, "9" * 1_000_000):
        assert parse_answer(text) is None
    assert time.perf_counter() - start < 0.5


# ------------------------------------------------------------------------ rewards
def test_single_attempt_rewards_follow_ragen():
    # numbers 2, 3, 8 and target 22: 8*3-2 = 22
    cases = [
        ("8*3-2", 1.0, True, "Your answer 8*3-2 = 22. Correct!"),
        ("8*3+2", 0.1, False, "Your answer 8*3+2 = 26, not 22."),  # right numbers, wrong value
        (
            "8/(3-3)",
            0.0,
            False,
            "Your answer 8/(3-3) divides by zero, but it must use each "
            "number exactly once: 3 is used twice but given once; 2 is not used.",
        ),
        (
            "8*(2-2)",
            0.0,
            False,
            "Your answer 8*(2-2) = 0, but it must use each number "
            "exactly once: 2 is used twice but given once; 3 is not used.",
        ),
        (
            "22",
            0.0,
            False,
            "Your answer 22 = 22, but it must use each number exactly once: "
            "22 is not given; 2, 3 and 8 are not used.",
        ),
    ]
    for answer, reward, success, text in cases:
        env = level_env([2, 3, 8], 22)
        obs, got, terminated, truncated, info = env.step(answer)
        assert (got, info["success"], terminated, truncated) == (reward, success, True, False)
        assert info["action_is_valid"] and info["action"] == answer
        if text is not None:
            assert obs.splitlines()[-1] == text


def test_division_by_zero_with_the_right_numbers_gets_the_format_score():
    env = level_env([2, 3, 3], 6)
    obs, reward, *_, info = env.step("2/(3-3)")
    assert reward == 0.1 and info["action_is_effective"] and info["answer_value"] == "undefined"
    assert obs.endswith("Your answer 2/(3-3) divides by zero.")


def test_format_score_is_configurable():
    env = level_env([2, 3, 8], 22, format_score=0.0)
    assert env.step("8*3+2")[1] == 0.0
    env = level_env([2, 3, 8], 22, format_score=0.5)
    assert env.step("8*3+2")[1] == 0.5


def test_invalid_answer_changes_nothing():
    env = level_env([2, 3, 8], 22, attempts=3)
    before = (env.render(), env.snapshot(), env.steps_left)
    obs, reward, terminated, truncated, info = env.step("eight times three")
    assert (obs, env.snapshot(), env.steps_left) == before
    assert (reward, terminated, truncated, info["action_is_valid"]) == (0.0, False, False, False)


# ------------------------------------------------------------------------ retries
def test_multi_attempt_feedback_then_success():
    env = level_env([3, 5, 2], 16, attempts=4)
    assert env.render() == "Target: 16\nNumbers: 3, 5, 2\nAttempts left: 4"
    obs, reward, terminated, _, info = env.step("(3+5)+2")
    assert (reward, terminated, info["success"]) == (0.0, False, False)
    assert (
        obs == "Target: 16\nNumbers: 3, 5, 2\nAttempts left: 3\nYour answer (3+5)+2 = 10, not 16."
    )
    obs, *_ = env.step("(3+5)*5")
    assert obs.endswith(
        "Your answer (3+5)*5 = 40, but it must use each number exactly once: "
        "5 is used twice but given once; 2 is not used."
    )
    obs, reward, terminated, truncated, info = env.step("(3+5)*2")
    assert (reward, terminated, truncated, info["success"]) == (1.0, True, False, True)
    assert obs.endswith("Attempts left: 1\nYour answer (3+5)*2 = 16. Correct!")


def test_multi_attempt_runs_out():
    env = level_env([3, 5, 2], 16, attempts=2)
    assert env.step("3+5+2")[2:4] == (False, False)
    assert env.optimal_success_probability() == 1.0
    _, reward, terminated, truncated, info = env.step("3*5+2")
    assert (reward, terminated, truncated, info["success"]) == (0.0, True, False, False)
    assert env.optimal_success_probability() == 0.0 and env.optimal_action() is None


def test_state_key_ignores_the_feedback_but_not_the_attempts_left():
    keys = []
    for answer in ("3+5+2", "3*5*2"):
        env = level_env([3, 5, 2], 16, attempts=4)
        start = env.state_key()
        env.step(answer)
        keys.append(env.state_key())
    assert keys[0] == keys[1] != start
    assert keys[0] == ((3, 5, 2), 16, 3)


# ------------------------------------------------------------------------ levels
def test_same_seed_same_level_and_levels_vary():
    env = CountdownEnv()
    first = [env.reset(seed=s)[0] for s in range(20)]
    assert first == [env.reset(seed=s)[0] for s in range(20)]
    assert len(set(first)) == 20


def test_levels_respect_the_arguments():
    env = CountdownEnv(num_numbers=[2, 4], max_number=20, max_target=50)
    counts = Counter()
    for seed in range(300):
        _, info = env.reset(seed=seed)
        numbers = info["numbers"]
        counts[len(numbers)] += 1
        assert all(1 <= n <= 20 for n in numbers) and 1 <= info["target"] <= 50
    assert set(counts) == {2, 3, 4} and min(counts.values()) > 70  # count drawn uniformly


def test_ops_restrict_the_hidden_expression():
    env = CountdownEnv(num_numbers=3, ops="+", max_target=300)
    for seed in range(20):
        env.reset(seed=seed)
        assert env.target == sum(env.numbers)


@pytest.mark.parametrize("num_numbers", [3, 4])
def test_solver_solves_every_level_fast(num_numbers):
    env = CountdownEnv(num_numbers=num_numbers)
    slowest = 0.0
    for seed in range(200):
        env.reset(seed=seed)
        start = time.perf_counter()
        action = env.optimal_action()
        slowest = max(slowest, time.perf_counter() - start)
        answer = parse_answer(action)
        assert answer.value == env.target and sorted(answer.numbers) == sorted(env.numbers)
        assert env.step(action)[1] == 1.0
    assert slowest < 0.05


def test_solver_finds_fraction_solutions_and_reports_unsolvable():
    action = solve([1, 5, 5, 5], 24)  # only (5-1/5)*5
    assert parse_answer(action).value == 24
    assert solve([1, 1, 1], 100) is None
    env = level_env([1, 1, 1], 100)
    assert env.optimal_action() is None and env.optimal_success_probability() == 0.0


def test_explain_walks_through_a_correct_answer():
    env = level_env([3, 5, 2], 16)
    assert env.explain(" (3+5)*2 ") == (
        "3+5 = 8, then 8*2 = 16, so (3+5)*2 reaches 16 using each number once."
    )
    assert env.explain("(3+5)+2") is None and env.explain("Jump") is None
    env = CountdownEnv()
    for seed in range(30):
        env.reset(seed=seed)
        action = env.optimal_action()
        text = env.explain(action)
        assert action in text and len(text.split()) <= 40


def test_sample_action_uses_each_number_once():
    env = CountdownEnv(num_numbers=4)
    env.reset(seed=5)
    rng = np.random.default_rng(0)
    for _ in range(50):
        answer = parse_answer(env.sample_action(rng))
        assert answer is not None and sorted(answer.numbers) == sorted(env.numbers)


@pytest.mark.parametrize("env_id", ["countdown", "countdown-multi"])
def test_policies_play_to_the_end(env_id):
    wins = {}
    for name in ("random", "solver"):
        policy = make_policy(name, seed=1)
        env = make(env_id)
        wins[name] = 0
        for seed in range(40):
            env.reset(seed=seed)
            while not env.done:
                env.step(policy(env))
            wins[name] += env.is_success()
    assert wins["solver"] == 40 and wins["random"] < 20


# ------------------------------------------------------------------------ arguments
@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"num_numbers": 1}, "out of range"),
        ({"num_numbers": 6}, "out of range"),
        ({"num_numbers": [4, 3]}, "out of range"),
        ({"num_numbers": "3"}, "num_numbers"),
        ({"num_numbers": True}, "num_numbers"),
        ({"num_numbers": [3.0, 4]}, "whole numbers"),
        ({"max_number": 0}, "max_number"),
        ({"max_target": -5}, "max_target"),
        ({"attempts": 0}, "attempts"),
        ({"attempts": 2.0}, "attempts"),
        ({"format_score": 1.0}, "format_score"),
        ({"format_score": -0.1}, "format_score"),
        ({"format_score": "0.1"}, "format_score"),
        ({"ops": ""}, "ops"),
        ({"ops": "+%"}, "ops"),
    ],
)
def test_bad_arguments_are_user_errors(kwargs, fragment):
    with pytest.raises(UserError, match=fragment):
        CountdownEnv(**kwargs)


@pytest.mark.parametrize(
    "options",
    [{"numbers": [3]}, {"numbers": "35", "target": 8}, {"numbers": [3, 5], "target": 0}],
)
def test_bad_levels_are_user_errors(options):
    with pytest.raises(UserError, match="numbers"):
        CountdownEnv().reset(options=options)


def test_impossible_generation_is_a_user_error():
    env = CountdownEnv(num_numbers=2, max_number=10**6, max_target=1, ops="+")
    with pytest.raises(UserError, match="max_target"):
        env.reset(seed=0)
