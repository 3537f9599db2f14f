"""Question answering over a user's JSONL file (GSM8K, MetaMathQA, ...) or generated arithmetic.

Each episode is one question; the agent answers in free text. With `attempts=1` (the
default) it is a one-turn task; with more, a wrong answer is told "Your answer 71 is not
correct." and the agent tries again. A correct answer ends the episode with reward 1; a
wrong one gives 0. Success = a correct answer within the attempts.

Which question a seed gives: with a file, reset(seed=s) takes record `seed_index(s, n)`, a
fixed stride through the n records, so seeds 0..n-1 (or any n consecutive seeds) ask every
question once; reset() without a seed draws one from the env's generator, and
options={"index": i} asks record i. Without a file, the question is generated from the seed.
The same seed always asks the same question.

    >>> env = QAEnv(difficulty=1)
    >>> obs, info = env.reset(seed=3)
    >>> obs
    'Question: What is 10 * 3?'
    >>> env.step("The answer is $30.")[1:3]
    (1.0, True)
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from starpo.envs.base import TextEnv
from starpo.envs.qa.data import (
    ANSWER_CAP,
    Record,
    arithmetic_record,
    clean_solution,
    load_records,
    normalize_text,
    number_label,
    numbers_match,
    parse_number,
    seed_index,
)
from starpo.errors import UserError

VERIFIERS = ("numeric", "exact")
MAX_ATTEMPTS = 20
#: A rationale quotes the worked solution only when it is this short (words).
MAX_RATIONALE_WORDS = 30
#: Words the exact verifier's random answers come from when there is no dataset.
_RANDOM_WORDS = ("yes", "no", "red", "blue", "north", "seven", "Paris", "water", "none")


class QAEnv(TextEnv):
    """Answer one question (a number or an exact text), in one or a few attempts."""

    description: ClassVar[str] = "Question answering over a JSONL file; free-text answers."
    reward_range = (0.0, 1.0)

    def __init__(
        self,
        path: str | Path | None = None,
        question_key: str = "question",
        answer_key: str = "answer",
        verifier: str = "numeric",
        attempts: int = 1,
        limit: int | None = None,
        difficulty: int | None = None,
    ) -> None:
        _check_int("attempts", attempts, 1, MAX_ATTEMPTS)
        super().__init__(max_steps=attempts)
        if verifier not in VERIFIERS:
            raise UserError(f"verifier must be 'numeric' or 'exact', got {verifier!r}")
        for name, key in (("question_key", question_key), ("answer_key", answer_key)):
            if not isinstance(key, str) or not key:
                raise UserError(f"{name} must be a non-empty field name, got {key!r}")
        if limit is not None:
            _check_int("limit", limit, 1, None)
        self.verifier = verifier
        self.numeric = verifier == "numeric"
        self.records: tuple[Record, ...] = ()
        if path is None:
            if limit is not None:
                raise UserError("limit applies to a data file; set path too, or drop limit")
            _check_int("difficulty", 2 if difficulty is None else difficulty, 1, 3)
            self.difficulty = 2 if difficulty is None else difficulty
        else:
            if difficulty is not None:
                raise UserError("difficulty applies to the generated set only; drop it or path")
            if not isinstance(path, str | Path) or not str(path).strip():
                raise UserError(f"path must be a JSONL file's path, got {path!r}")
            self.records = load_records(path, question_key, answer_key, self.numeric, limit)
            self.difficulty = 0
        self.record = Record("", "", "")
        self.index = -1  # the record asked (-1: generated)
        self.feedback = ""
        self.solved = False
        self._seed: Any = None

    # ------------------------------------------------------------------------ prompt
    @property
    def instruction(self) -> str:  # type: ignore[override]
        what = "a single number only, without units" if self.numeric else "the answer only"
        text = f"Answer the question. Reply with {what}."
        if self.max_steps > 1:
            text += (
                f" You have {self.max_steps} attempts: a wrong answer is told so, and you "
                "may answer again."
            )
        return text

    @property
    def answer_format(self) -> str:  # type: ignore[override]
        return "a single number, such as 42 or 3.5" if self.numeric else "the exact answer text"

    # ------------------------------------------------------------------------- hooks
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        self._seed = seed  # a file's record is picked from the seed itself (see module doc)
        return super().reset(seed=seed, options=options)

    def _reset(self, options: dict[str, Any]) -> dict[str, Any]:
        self.index = self._pick(options)
        if self.index < 0:
            self.record = arithmetic_record(self.np_random, self.difficulty)
        else:
            self.record = self.records[self.index]
        self.feedback = ""
        self.solved = False
        return {"index": self.index}

    def _pick(self, options: dict[str, Any]) -> int:
        if not self.records:
            return -1
        size = len(self.records)
        if "index" in options:
            index = options["index"]
            if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < size:
                raise UserError(f"options index must be a record number 0..{size - 1}")
            return index
        seed = self._seed
        if isinstance(seed, int | np.integer) and not isinstance(seed, bool):
            return seed_index(int(seed), size)
        return int(self.np_random.integers(size))

    def parse_action(self, action: Any) -> Fraction | str | None:
        """A number (numeric) or the answer text, spaces collapsed (exact); None for
        non-text, blank or over-long answers, or (numeric) text without a number."""
        if not isinstance(action, str) or not action.strip() or len(action) > ANSWER_CAP:
            return None
        if self.numeric:
            return parse_number(action)
        return " ".join(action.split())

    def action_label(self, action: Fraction | str) -> str:
        return number_label(action) if isinstance(action, Fraction) else action

    def sample_action(self, rng: np.random.Generator) -> str:
        """A random number from 0 to 999 (numeric); a dataset answer, or a word (exact)."""
        if self.numeric:
            return str(int(rng.integers(0, 1000)))
        if self.records:
            return self.records[int(rng.integers(len(self.records)))].answer
        return str(rng.choice(_RANDOM_WORDS))

    def _step(self, action: Fraction | str) -> tuple[float, bool, bool, dict[str, Any]]:
        self.solved = self.is_correct(action)
        verdict = "correct" if self.solved else "not correct"
        self.feedback = f"Your answer {self.action_label(action)} is {verdict}."
        if not self.solved and self.num_steps + 1 < self.max_steps:
            self.feedback += " Try again."
        return float(self.solved), self.solved, True, {"correct": self.solved}

    def is_correct(self, action: Fraction | str) -> bool:
        """Whether a parsed answer matches the record's answer under the verifier."""
        if isinstance(action, Fraction):
            expected = parse_number(self.record.answer)
            return expected is not None and numbers_match(action, expected)
        return normalize_text(action) == normalize_text(self.record.answer)

    def render(self) -> str:
        text = f"Question: {self.record.question}"
        return f"{text}\n{self.feedback}" if self.feedback else text

    def snapshot(self) -> Any:
        return (self.index, self.record, self.num_steps, self.feedback, self.solved)

    def state_key(self) -> Any:
        """The question and the attempts used: turns that face the same question with the
        same attempts left are one state for GiGPO, whichever wrong answers came before (the
        feedback text differs, the task does not)."""
        return (self.record.question, self.num_steps)

    def is_success(self) -> bool:
        return self.solved

    # ------------------------------------------------------------------------ solver
    def optimal_action(self) -> str | None:
        """The dataset's answer (canonical: "1000" for "1,000"); None once the episode ends."""
        if self.done:
            return None
        if self.numeric:
            value = parse_number(self.record.answer)
            return number_label(value) if value is not None else None
        return self.record.answer

    def optimal_success_probability(self) -> float:
        return 1.0 if self.solved or not self.done else 0.0

    def explain(self, action: str) -> str | None:
        """The worked solution (when short) and the answer; None for a wrong answer."""
        parsed = self.parse_action(action)
        if self.done or parsed is None or not self.is_correct(parsed):
            return None
        label = self.action_label(parsed)
        working = clean_solution(self.record.solution)
        if working and len(working.split()) <= MAX_RATIONALE_WORDS:
            return f"{_sentences(working)} So I answer {label}."
        return f"I work it out and get {label}, so I answer {label}."


def _sentences(working: str) -> str:
    """The working as text that ends a sentence."""
    return working if working.endswith((".", "!", "?")) else f"{working}."


def _check_int(name: str, value: Any, low: int, high: int | None) -> None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= low
    if not ok or (high is not None and value > high):
        bound = f"from {low} to {high}" if high is not None else f"of at least {low}"
        raise UserError(f"{name} must be a whole number {bound}, got {value!r}")
