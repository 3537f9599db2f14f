"""Countdown (RAGEN's and TinyZero's arithmetic puzzle) as a free-text env.

The agent sees a few numbers and a target and answers with an arithmetic expression, e.g.
numbers 44, 19, 35 and target 98: "44+19+35". As in RAGEN, the expression must use every
given number exactly once (no number left out, none used twice, no other numbers), with
+ - * / and parentheses; a unary minus is allowed ("-3+5+7", RAGEN's own example), digits
cannot be glued together. Values are exact fractions: 8/3*3 equals 8. A trailing claimed
result ("(3+5)*3 = 24") is dropped; only the expression is judged.

Any well-formed expression is a valid action, even a wrong one; only unreadable text
(words, **, //, decimals, over 200 characters) is invalid. Rewards follow RAGEN: 1.0 for a
correct answer, `format_score` (0.1) for a wrong one that uses each number exactly once
(a division by zero included), 0.0 for one that does not.

`attempts` > 1 (the id countdown-multi) allows retries: after a wrong answer the next
observation says why it failed ("Your answer (3+5)*2 = 16, not 24.", "..., but it must use
each number exactly once: 5 is not given; 7 is not used."), and the format score defaults to
0 there, so that wrong attempts never add up to more than a correct first answer. The state
key (GiGPO) leaves that feedback out: turns from the same puzzle with the same attempts left
are compared, whatever wrong answers came before.

Levels are built from the seed: draw the numbers, combine them in a random order with random
operations, and take the value as the target when it is a whole number in 1..max_target (else
draw again), so every level is solvable.

    >>> env = CountdownEnv()
    >>> print(env.reset(options={"numbers": [3, 5, 8], "target": 16})[0])
    Target: 16
    Numbers: 3, 5, 8
    >>> obs, reward, terminated, truncated, info = env.step("(3+5)*8")
    >>> reward, terminated, obs.splitlines()[-1]
    (0.1, True, 'Your answer (3+5)*8 = 64, not 16.')
"""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Real
from typing import Any, ClassVar

import numpy as np

from starpo.envs.base import TextEnv
from starpo.envs.countdown.solver import (
    OPERATIONS,
    Answer,
    generate_level,
    misuse,
    parse_answer,
    random_expression,
    show,
    solve,
)
from starpo.errors import UserError

#: Most numbers in a level. The solver takes under 3 ms for 4 numbers and about 1 ms on
#: average for 5 (up to ~50 ms when only a fraction solution exists; a second to prove an
#: unsolvable 5-number custom level has no solution).
MAX_NUMBERS = 5
#: Largest number or target accepted (keeps values readable and search fast).
MAX_VALUE = 10**6


class CountdownEnv(TextEnv):
    """Reach the target with an expression using each number once; `attempts` tries."""

    description: ClassVar[str] = "Countdown: reach the target with + - * / over given numbers."
    legend: ClassVar[dict[str, str]] = {}
    answer_format = "an arithmetic expression over the given numbers, such as (3+5)*2"

    def __init__(
        self,
        num_numbers: int | Sequence[int] = (3, 4),
        max_number: int = 100,
        max_target: int = 100,
        attempts: int = 1,
        format_score: float | None = None,
        ops: str = OPERATIONS,
    ) -> None:
        self.count_range = _check_count(num_numbers)
        self.max_number = _check_int("max_number", max_number, 1)
        self.max_target = _check_int("max_target", max_target, 1)
        self.attempts = _check_int("attempts", attempts, 1)
        super().__init__(max_steps=self.attempts)
        if format_score is None:  # several tries: wrong answers must not pay more than one
            format_score = 0.1 if self.attempts == 1 else 0.0
        is_number = isinstance(format_score, Real) and not isinstance(format_score, bool)
        if not is_number or not 0.0 <= format_score < 1.0:
            raise UserError(f"format_score must be a number in [0, 1), got {format_score!r}")
        self.format_score = float(format_score)
        if not isinstance(ops, str) or not ops or set(ops) - set(OPERATIONS):
            raise UserError(f"ops must be a non-empty string of + - * /, e.g. '+-', got {ops!r}")
        self.ops = "".join(sorted(set(ops), key=OPERATIONS.index))
        self.reward_range = (0.0, 1.0)
        self.numbers: tuple[int, ...] = ()
        self.target = 0
        self.feedback = ""
        self.solved = False
        self._solution: str | None = None
        self._solved_for: tuple[tuple[int, ...], int] | None = None

    # ------------------------------------------------------------------------ text
    @property
    def instruction(self) -> str:  # type: ignore[override]
        text = (
            "You are playing Countdown. Combine the given numbers with +, -, *, / and "
            "parentheses into an expression that equals the target. Use every number "
            "exactly once; you cannot join digits into new numbers."
        )
        if self.attempts > 1:
            text += f" You have {self.attempts} attempts; after a wrong one you are told why."
        return text

    def render(self) -> str:
        lines = [f"Target: {self.target}", f"Numbers: {', '.join(map(str, self.numbers))}"]
        if self.attempts > 1:
            lines.append(f"Attempts left: {self.steps_left}")
        if self.feedback:
            lines.append(self.feedback)
        return "\n".join(lines)

    # ----------------------------------------------------------------- episode hooks
    def _reset(self, options: dict[str, Any]) -> dict[str, Any]:
        if "numbers" in options or "target" in options:
            self.numbers, self.target = _check_level(options.get("numbers"), options.get("target"))
        else:
            level = generate_level(
                self.np_random, self.count_range, self.max_number, self.max_target, self.ops
            )
            if level is None:
                raise UserError(
                    f"no level found with targets 1..{self.max_target} from numbers "
                    f"1..{self.max_number}; raise max_target or lower max_number"
                )
            self.numbers, self.target = level
        self.feedback = ""
        self.solved = False
        return {"numbers": list(self.numbers), "target": self.target}

    def parse_action(self, action: Any) -> Answer | None:
        return parse_answer(action)

    def action_label(self, action: Answer) -> str:
        return action.text

    def sample_action(self, rng: np.random.Generator) -> str:
        """A random expression using each number once (usually wrong, always well formed)."""
        return random_expression(rng, self.numbers or (1, 2), OPERATIONS).text

    def _step(self, action: Answer) -> tuple[float, bool, bool, dict[str, Any]]:
        problems = misuse(action.numbers, self.numbers)
        self.solved = not problems and action.value == self.target
        self.feedback = self._feedback(action, problems)
        last_try = self.num_steps + 1 >= self.max_steps
        if self.solved:
            reward = 1.0
        else:
            reward = 0.0 if problems else self.format_score
        # Out of attempts is the end of the game (terminated), not a cut-off time limit.
        info = {"answer_value": show(action.value), "uses_each_number_once": not problems}
        return reward, self.solved or last_try, not problems, info

    def _feedback(self, action: Answer, problems: list[str]) -> str:
        """Why the answer is right or wrong, in one line."""
        head = f"Your answer {action.text}"
        head += " divides by zero" if action.value is None else f" = {show(action.value)}"
        if problems:
            return f"{head}, but it must use each number exactly once: {'; '.join(problems)}."
        if action.value is None:
            return f"{head}."
        if action.value != self.target:
            return f"{head}, not {self.target}."
        return f"{head}. Correct!"

    def snapshot(self) -> Any:
        return (self.numbers, self.target, self.feedback, self.solved)

    def is_success(self) -> bool:
        return self.solved

    def state_key(self) -> Any:
        """The puzzle and the attempts left, not the feedback: after different wrong answers
        the task is the same (the same answers win), so GiGPO compares those turns."""
        return (self.numbers, self.target, self.steps_left)

    # ------------------------------------------------------------------------ solver
    def solution(self) -> str | None:
        """An expression that solves the current level (None for an unsolvable custom
        level); searched once per level."""
        level = (self.numbers, self.target)
        if self._solved_for != level:
            self._solution, self._solved_for = solve(*level), level
        return self._solution

    def optimal_action(self) -> str | None:
        return None if self.done else self.solution()

    def optimal_success_probability(self) -> float:
        if self.solved:
            return 1.0
        return float(not self.done and self.solution() is not None)

    def explain(self, action: str) -> str | None:
        """The operations of a correct answer, step by step; None for any other answer."""
        answer = parse_answer(action)
        if self.done or answer is None or misuse(answer.numbers, self.numbers):
            return None
        if answer.value != self.target:
            return None
        steps = ", then ".join(answer.steps)
        return f"{steps}, so {answer.text} reaches {self.target} using each number once."


# ------------------------------------------------------------------- validation
def _check_int(name: str, value: Any, low: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= MAX_VALUE:
        raise UserError(f"{name} must be a whole number from {low} to {MAX_VALUE}, got {value!r}")
    return value


def _check_count(value: Any) -> tuple[int, int]:
    """num_numbers: one count (4) or an inclusive range drawn per level ([3, 4])."""
    hint = f"use a count from 2 to {MAX_NUMBERS} or a range such as [3, 4]"
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value, value)
    if isinstance(value, str) or not isinstance(value, Sequence) or len(value) != 2:
        raise UserError(
            f"num_numbers must be a count or a [low, high] range, got {value!r}; {hint}"
        )
    low, high = value
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (low, high)):
        raise UserError(f"num_numbers must hold whole numbers, got {value!r}; {hint}")
    if not 2 <= low <= high <= MAX_NUMBERS:
        raise UserError(f"num_numbers {list(value)} is out of range; {hint}")
    return low, high


def _check_level(numbers: Any, target: Any) -> tuple[tuple[int, ...], int]:
    """A level given in reset options: {"numbers": [3, 5, 8], "target": 16}."""
    hint = 'pass options={"numbers": [3, 5, 8], "target": 16}'
    ok = isinstance(numbers, Sequence) and not isinstance(numbers, str)
    if not ok or not 2 <= len(numbers) <= MAX_NUMBERS:
        raise UserError(f"numbers must be a list of 2 to {MAX_NUMBERS} numbers; {hint}")
    for n in (*numbers, target):
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_VALUE:
            raise UserError(
                f"numbers and target must be whole numbers from 1 to {MAX_VALUE}, got {n!r}; {hint}"
            )
    return tuple(numbers), target
