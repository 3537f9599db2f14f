"""Data for the QA env: JSONL loading (cached per file), answer reading, and a generated
arithmetic set.

A record is a question, its final answer and the worked solution before it, if any. A
dataset answer such as GSM8K's "48 / 2 = 24\\n#### 72" splits into the solution and the final
answer after the last "####"; MetaMathQA's "... The answer is: 72" splits the same way at its
last "The answer is". Numbers are read leniently ("$1,234", "72 dollars", "-3.5", "3/4",
"\\frac{3}{4}", "1.5e3"): the last number in the text counts, as in GSM8K's own evaluation.
"""

from __future__ import annotations

import json
import re
import threading
from fractions import Fraction
from math import gcd
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from starpo.errors import UserError

#: Longest answer (characters) an agent may give; longer text is an invalid action.
ANSWER_CAP = 500
#: Relative tolerance of the numeric verifier (absolute below magnitude 1).
REL_TOL = Fraction(1, 10**6)  # a Fraction: "1E400" must not overflow a float

_NUMBER = re.compile(
    r"(?<![\w.])-?(?:\d+/\d+|(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)(?:e[-+]?\d{1,3})?)",
    re.IGNORECASE,
)
_FRAC = re.compile(r"\\d?frac\{\s*(-?\d+)\s*\}\{\s*(\d+)\s*\}")
_THE_ANSWER_IS = re.compile(r"the answer is:?", re.IGNORECASE)
_CALCULATOR = re.compile(r"<<[^>]*>>")  # GSM8K's calculator notes: "<<48/2=24>>"


class Record(NamedTuple):
    """One question: `answer` is the final answer text, `solution` the worked text before it."""

    question: str
    answer: str
    solution: str


# ------------------------------------------------------------------------ answer reading
def split_answer(text: str) -> tuple[str, str]:
    """(solution, final answer) of a dataset answer: the text after the last "####", else
    after the last "The answer is", else the whole text (with no solution)."""
    if "####" in text:
        solution, _, final = text.rpartition("####")
        return solution.strip(), final.strip()
    marks = list(_THE_ANSWER_IS.finditer(text))
    if marks:
        last = marks[-1]
        return text[: last.start()].strip(), text[last.end() :].strip()
    return "", text.strip()


def parse_number(text: str) -> Fraction | None:
    """The last number in `text` as an exact fraction, or None when there is none."""
    text = _FRAC.sub(r"\1/\2", text.replace("\u2212", "-"))
    matches = _NUMBER.findall(text)
    if not matches:
        return None
    token = matches[-1].replace(",", "")
    try:
        return Fraction(token)
    except (ValueError, ZeroDivisionError):  # "3/0"
        return None


def number_label(value: Fraction) -> str:
    """Canonical text of a number: "72", "-3.5", or "1/3" when no decimal of up to 6 places
    is exact. Exact integer arithmetic: a 500-digit answer must not overflow a float.
    An integer longer than an answer may be ("1E500") is written with its exponent, so
    that its label reads back as the same number."""
    if value.denominator == 1:
        digits = str(value.numerator)
        if len(digits) <= ANSWER_CAP:
            return digits
        mantissa = digits.rstrip("0")
        return f"{mantissa}e{len(digits) - len(mantissa)}"
    for places in range(1, 7):
        scaled = value * 10**places
        if scaled.denominator == 1:
            digits = str(abs(scaled.numerator)).rjust(places + 1, "0")
            sign = "-" if value < 0 else ""
            return f"{sign}{digits[:-places]}.{digits[-places:]}"
    label = f"{value.numerator}/{value.denominator}"
    if len(label) > ANSWER_CAP:  # e.g. "1E-500": written back with its exponent
        places = _decimal_places(value.denominator)
        if places is not None:
            return f"{value.numerator * 10**places // value.denominator}e-{places}"
    return label


def _decimal_places(denominator: int) -> int | None:
    """The decimal places a fraction with this (reduced) denominator needs, or None when it
    has no finite decimal (a factor other than 2 and 5)."""
    twos = fives = 0
    while denominator % 2 == 0:
        denominator, twos = denominator // 2, twos + 1
    while denominator % 5 == 0:
        denominator, fives = denominator // 5, fives + 1
    return max(twos, fives) if denominator == 1 else None


def numbers_match(given: Fraction, expected: Fraction) -> bool:
    """Equal within REL_TOL of the larger magnitude (absolute tolerance below 1), in exact
    arithmetic: a float product would overflow on an answer like "1E400"."""
    return abs(given - expected) <= REL_TOL * max(1, abs(expected), abs(given))


def normalize_text(text: str) -> str:
    """The exact verifier's form: casefolded, spaces collapsed, one trailing period dropped."""
    folded = " ".join(text.split()).casefold()
    return folded[:-1].rstrip() if folded.endswith(".") else folded


def clean_solution(solution: str) -> str:
    """A worked solution on one line, without GSM8K's calculator notes; lines without their
    own punctuation ("48 * 2 = 96") are joined by commas."""
    lines = [" ".join(line.split()) for line in _CALCULATOR.sub("", solution).splitlines()]
    lines = [line for line in lines if line]
    return " ".join(
        line if i == len(lines) - 1 or line.endswith((".", "!", "?", ",", ";", ":")) else line + ","
        for i, line in enumerate(lines)
    )


# ----------------------------------------------------------------------------- loading
_CACHE: dict[tuple[Any, ...], tuple[Record, ...]] = {}
_CACHE_SIZE = 8  # distinct files (or key choices) kept; the rollout builds many envs per file
_LOCK = threading.Lock()


def load_records(
    path: str | Path, question_key: str, answer_key: str, numeric: bool, limit: int | None
) -> tuple[Record, ...]:
    """The records of a JSONL file, read once per (file, modification time, arguments) in a
    process: the rollout engine builds one env per episode."""
    file = Path(path).expanduser()
    try:
        stat = file.stat()
    except OSError:
        raise UserError(
            f"QA data file {str(path)!r} not found (resolved to {file.absolute()}); set "
            "env.kwargs.path to a JSONL file, relative to the working directory"
        ) from None
    if not file.is_file():
        raise UserError(f"QA data path {str(path)!r} is not a file; give a JSONL file")
    key = (str(file.resolve()), stat.st_mtime_ns, stat.st_size, question_key, answer_key)
    key += (numeric, limit)
    with _LOCK:
        if key not in _CACHE:
            records = read_jsonl(file, question_key, answer_key, numeric, limit)
            if len(_CACHE) >= _CACHE_SIZE:
                _CACHE.pop(next(iter(_CACHE)))
            _CACHE[key] = records
        return _CACHE[key]


def read_jsonl(
    file: Path, question_key: str, answer_key: str, numeric: bool, limit: int | None
) -> tuple[Record, ...]:
    """Parse and check every line (blank lines skipped); a bad line is a UserError naming it."""
    records: list[Record] = []
    with file.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if limit is not None and len(records) >= limit:
                break
            where = f"{file}:{number}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise UserError(f"{where}: not UTF-8 text; save the file as UTF-8") from None
            if line.strip():
                records.append(_record(json_object(line, where), question_key, answer_key, where))
                _check_answer(records[-1], numeric, where)
    if not records:
        raise UserError(
            f"QA data file {str(file)!r} has no records; write one JSON object per line, "
            'e.g. {"question": "What is 2 + 3?", "answer": "5"}'
        )
    return tuple(records)


def json_object(line: str, where: str) -> dict[str, Any]:
    """One JSONL line as a dict; anything else is a UserError naming the line."""
    try:
        value = json.loads(line)
    except json.JSONDecodeError as exc:
        raise UserError(
            f"{where}: not valid JSON ({exc.msg}, column {exc.colno}); each line must be one "
            "JSON object"
        ) from None
    if not isinstance(value, dict):
        raise UserError(f"{where}: a JSON {type(value).__name__}, not an object; write {{...}}")
    return value


def _record(row: dict[str, Any], question_key: str, answer_key: str, where: str) -> Record:
    fields = []
    for role, key in (("question", question_key), ("answer", answer_key)):
        if key not in row:
            keys = ", ".join(map(repr, list(row)[:8])) or "none"
            raise UserError(
                f"{where}: no {key!r} key (keys: {keys}); set {role}_key to the field that "
                f"holds the {role}"
            )
        value = row[key]
        if isinstance(value, int | float) and not isinstance(value, bool):
            value = str(value)  # {"answer": 72}
        if not isinstance(value, str) or not value.strip():
            raise UserError(f"{where}: {key!r} must be non-empty text, got {value!r:.40}")
        fields.append(value)
    solution, final = split_answer(fields[1])
    return Record(fields[0].strip(), final, solution)


def _check_answer(record: Record, numeric: bool, where: str) -> None:
    if not record.answer:
        raise UserError(f"{where}: the answer after '####' is empty; write the final answer")
    if numeric and parse_number(record.answer) is None:
        raise UserError(
            f"{where}: answer {record.answer!r:.60} has no number; fix the line or use "
            "verifier=exact"
        )
    if not numeric and len(record.answer) > ANSWER_CAP:
        raise UserError(
            f"{where}: the answer has {len(record.answer)} characters, more than an agent may "
            f"give ({ANSWER_CAP}); put the final answer after '####'"
        )


def seed_index(seed: int, size: int) -> int:
    """The record a seed picks: seed * stride mod size, with the stride coprime to the size
    (near size / golden ratio), so seeds 0..size-1 visit every record once, and consecutive
    seeds (a training batch) land far apart in the file."""
    stride = max(1, round(size / 1.618033988749895))
    while gcd(stride, size) != 1:
        stride += 1
    return (seed * stride) % size


# -------------------------------------------------------------------- generated arithmetic
_SMALL = (2, 13)  # a multiplier: 2..12
_LARGE = (2, 100)  # any other operand: 2..99
_OPERATORS = ("+", "-", "*")


def arithmetic_record(rng: np.random.Generator, difficulty: int) -> Record:
    """A question "What is 37 + 48 * 2?" with operators +, - and * (and parentheses at
    difficulty 3) whose steps and answer are whole numbers >= 0. Difficulty 1: two operands,
    2: three, 3: four with the first two in parentheses. A few rng draws: fast."""
    for attempt in range(100):
        ops = [str(rng.choice(_OPERATORS)) for _ in range(difficulty)]
        if attempt == 99:
            ops = ["+"] * difficulty  # always valid: the loop ends
        nums = [int(rng.integers(*_LARGE))]
        nums += [int(rng.integers(*(_SMALL if op == "*" else _LARGE))) for op in ops]
        steps = _evaluate(nums, ops, grouped=difficulty >= 3)
        if steps is not None:
            break
    tokens = [str(nums[0])]
    for op, n in zip(ops, nums[1:], strict=True):
        tokens += [op, str(n)]
    if difficulty >= 3:
        tokens[0], tokens[2] = f"({tokens[0]}", f"{tokens[2]})"
    answer = steps[-1].rpartition("= ")[2]
    return Record(f"What is {' '.join(tokens)}?", answer, "\n".join(steps))


def _evaluate(nums: list[int], ops: list[str], grouped: bool) -> list[str] | None:
    """The worked steps ("48 * 2 = 96") of nums joined by ops, with * before + and -, and
    the first pair first when grouped; None when a step goes below 0."""
    nums, ops, steps = list(nums), list(ops), []

    def reduce(i: int) -> bool:
        a, op, b = nums[i], ops[i], nums[i + 1]
        value = a + b if op == "+" else a - b if op == "-" else a * b
        steps.append(f"{a} {op} {b} = {value}")
        nums[i : i + 2], ops[i : i + 1] = [value], []
        return value >= 0

    if grouped and not reduce(0):
        return None
    while "*" in ops:
        if not reduce(ops.index("*")):
            return None
    while ops:
        if not reduce(0):
            return None
    return steps


def arithmetic_jsonl(count: int = 50, seed: int = 0) -> str:
    """`count` generated records as GSM8K-style JSONL ("steps\\n#### answer"), difficulties
    1, 2, 3 in turn: the small set tests/envs/data/arithmetic.jsonl ships."""
    rng = np.random.default_rng(seed)
    lines = []
    for i in range(count):
        record = arithmetic_record(rng, difficulty=1 + i % 3)
        answer = f"{record.solution}\n#### {record.answer}"
        lines.append(json.dumps({"question": record.question, "answer": answer}))
    return "\n".join(lines) + "\n"
