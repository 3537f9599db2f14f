"""Countdown arithmetic: read answers without eval(), build levels, and solve them exactly.

All values are `fractions.Fraction`, so 8/3*3 is exactly 8 and no float rounding can turn a
wrong answer into a right one. Answers are read with `ast.parse(..., mode="eval")` and only
these nodes are accepted: whole-number literals, + - * / between two expressions, a unary
minus (RAGEN's own example answer is "- 3 + 5 + 7"), and parentheses; anything else (names,
calls, **, //, floats, 0x10, 1_000) makes the answer unreadable.

Expressions are built and solved the same way: repeatedly combine two of the remaining
values with one operation until a single value is left. Every binary expression tree over
the numbers is such a sequence, so the search below finds a solution whenever one exists.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, NamedTuple

import numpy as np

#: Longest answer read; longer text is rejected before parsing, so huge inputs cost nothing.
MAX_ANSWER_CHARS = 200
#: The four operations (the default `ops` of generated levels; random answers use all four).
OPERATIONS = "+-*/"

_SYMBOLS = str.maketrans({"×": "*", "÷": "/", "−": "-"})  # common typeset forms
_ALLOWED = re.compile(r"[0-9+\-*/()\s]+")
# "(3+5)*3 = 24": the claimed result after "=" is dropped; only the expression is judged.
_CLAIMED_RESULT = re.compile(r"=\s*-?\d+\s*$")
_AST_SYMBOL = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}
_ATOM, _PRODUCT, _SUM = 3, 2, 1  # precedence of a literal, of * and /, of + and -


@dataclass(frozen=True)
class Answer:
    """A well-formed answer: its canonical text, the literals it uses, its exact value."""

    text: str  # without spaces or a claimed "= N"
    numbers: tuple[int, ...]  # the literals used, sorted
    value: Fraction | None  # None when it divides by zero
    steps: tuple[str, ...]  # each operation in evaluation order, e.g. "3+5 = 8"


class _Unreadable(Exception):
    """The text is not an expression of the accepted form."""


def parse_answer(text: object) -> Answer | None:
    """The answer `text` spells, or None when it is not a well-formed expression.
    Never raises; non-strings, blanks and text over MAX_ANSWER_CHARS are None."""
    if not isinstance(text, str):
        return None
    text = text.strip()
    if len(text) > MAX_ANSWER_CHARS:  # before any other work on it
        return None
    body = _CLAIMED_RESULT.sub("", text.translate(_SYMBOLS)).strip()
    if not body or not _ALLOWED.fullmatch(body):
        return None
    try:
        tree = ast.parse(body, mode="eval")
        numbers: list[int] = []
        steps: list[str] = []
        value = _evaluate(tree.body, numbers, steps)
    except (_Unreadable, SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    return Answer(re.sub(r"\s+", "", body), tuple(sorted(numbers)), value, tuple(steps))


def _evaluate(node: ast.expr, numbers: list[int], steps: list[str]) -> Fraction | None:
    """Exact value of an accepted node (None after a division by zero), collecting the
    literals it uses and its operations; raise _Unreadable on any other node."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        numbers.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _evaluate(node.operand, numbers, steps)
        return None if inner is None else -inner
    if isinstance(node, ast.BinOp) and type(node.op) in _AST_SYMBOL:
        symbol = _AST_SYMBOL[type(node.op)]
        left = _evaluate(node.left, numbers, steps)
        right = _evaluate(node.right, numbers, steps)  # read both sides: all literals count
        value = apply(left, symbol, right)
        if value is not None:
            steps.append(f"{show(left)}{symbol}{_show_operand(right)} = {show(value)}")
        return value
    raise _Unreadable


def apply(left: Fraction | None, symbol: str, right: Fraction | None) -> Fraction | None:
    """`left symbol right` exactly; None when either side is None or it divides by zero."""
    if left is None or right is None or (symbol == "/" and right == 0):
        return None
    if symbol == "+":
        return left + right
    if symbol == "-":
        return left - right
    if symbol == "*":
        return left * right
    return left / right


def show(value: Fraction | None) -> str:
    """A value as the agent reads it: 24, -3 or 7/2."""
    return "undefined" if value is None else str(value)


def _show_operand(value: Fraction | None) -> str:
    text = show(value)
    return f"({text})" if text.startswith("-") else text  # "8*(-3)", not "8*-3"


def misuse(used: Sequence[int], given: Sequence[int]) -> list[str]:
    """How `used` breaks "each given number exactly once", e.g. ["5 is not given",
    "3 is used twice but given once", "7 and 8 are not used"]; empty when it does not."""
    used_count, given_count = Counter(used), Counter(given)
    numbers = sorted(set(used_count) | set(given_count))
    problems = []
    not_given = [n for n in numbers if not given_count[n]]
    if not_given:
        problems.append(f"{_listed(not_given)} not given")
    for n in numbers:
        if used_count[n] and given_count[n] and used_count[n] != given_count[n]:
            problems.append(
                f"{n} is used {_times(used_count[n])} but given {_times(given_count[n])}"
            )
    unused = [n for n in numbers if not used_count[n]]
    if unused:
        problems.append(f"{_listed(unused)} not used")
    return problems


def _listed(numbers: list[int]) -> str:
    """[7] -> "7 is", [7, 8, 9] -> "7, 8 and 9 are"."""
    if len(numbers) == 1:
        return f"{numbers[0]} is"
    return f"{', '.join(map(str, numbers[:-1]))} and {numbers[-1]} are"


def _times(count: int) -> str:
    return {1: "once", 2: "twice"}.get(count, f"{count} times")


# ------------------------------------------------------------------- expressions
class Term(NamedTuple):
    """A partial expression: its exact value, its text and the precedence of its top
    operation (decides where the text needs parentheses when it is combined further)."""

    value: Fraction | None
    text: str
    precedence: int


def literal(number: int) -> Term:
    return Term(Fraction(number), str(number), _ATOM)


def combine(left: Term, symbol: str, right: Term) -> Term:
    """`left symbol right` with only the parentheses its value needs: a-(b+c) keeps them,
    a+(b-c) is written a+b-c (the same value)."""
    left_text = f"({left.text})" if symbol in "*/" and left.precedence == _SUM else left.text
    if symbol == "/":
        wrap_right = right.precedence != _ATOM  # a/(b*c), a/(b+c)
    else:
        wrap_right = symbol != "+" and right.precedence == _SUM  # a-(b+c), a*(b-c)
    right_text = f"({right.text})" if wrap_right else right.text
    precedence = _SUM if symbol in "+-" else _PRODUCT
    return Term(apply(left.value, symbol, right.value), left_text + symbol + right_text, precedence)


def random_expression(rng: np.random.Generator, numbers: Sequence[int], ops: str) -> Term:
    """A random expression using each of `numbers` once: combine two random remaining
    terms with a random operation from `ops` until one term is left (its value is None
    when it divides by zero)."""
    terms = [literal(n) for n in numbers]
    while len(terms) > 1:
        i, j = (int(k) for k in rng.choice(len(terms), size=2, replace=False))
        symbol = ops[int(rng.integers(len(ops)))]
        joined = combine(terms[i], symbol, terms[j])
        terms = [t for k, t in enumerate(terms) if k not in (i, j)] + [joined]
    return terms[0]


def generate_level(
    rng: np.random.Generator,
    count_range: tuple[int, int],
    max_number: int,
    max_target: int,
    ops: str,
    max_tries: int = 10_000,
) -> tuple[tuple[int, ...], int] | None:
    """Numbers and a target that a random expression over them reaches, so the level is
    solvable by construction: draw how many numbers, then the numbers (1..max_number) and a
    random expression; keep it when its value is a whole number in 1..max_target, else
    draw them again (all from `rng`, so a seed gives one level). None after `max_tries`."""
    low, high = count_range
    count = int(rng.integers(low, high + 1))  # drawn once: retries must not favour a count
    for _ in range(max_tries):
        numbers = tuple(int(n) for n in rng.integers(1, max_number + 1, size=count))
        value = random_expression(rng, numbers, ops).value
        if value is not None and value.denominator == 1 and 1 <= value <= max_target:
            return numbers, int(value)
    return None


# ------------------------------------------------------------------------ solver
# The search works on values and small tuples, and writes the text only for the solution:
# building strings for every partial expression would cost more than the search itself.
Plan = int | tuple  # a literal, or (left plan, symbol, right plan)
Joins = Callable[[Any, Plan, Any, Plan], list[tuple[Any, Plan]]]


def solve(numbers: Iterable[int], target: int) -> str | None:
    """An expression using each number exactly once that equals `target`, or None when
    there is none. Tries whole, non-negative intermediate results first (the readable
    solutions a person writes; plain ints, many times faster than Fractions), then any
    exact fractions."""
    numbers = list(numbers)
    if len(numbers) == 1:
        return str(numbers[0]) if numbers[0] == target else None
    plan = _search([(n, n) for n in numbers], target, _whole_joins, set())
    if plan is None:
        plan = _search([(Fraction(n), n) for n in numbers], Fraction(target), _joins, set())
    return None if plan is None else _write(plan).text


def _search(items: list[tuple[Any, Plan]], goal: Any, joins: Joins, dead: set) -> Plan | None:
    """Depth-first over "combine two items"; `dead` memoises value multisets from which the
    goal is unreachable (how a value was made does not matter for what it can reach)."""
    if len(items) == 2:
        return next((p for v, p in joins(*items[0], *items[1]) if v == goal), None)
    key = tuple(sorted(v for v, _ in items))
    if key in dead:
        return None
    for i in range(len(items)):
        for j in range(i + 1, len(items)):
            rest = [t for k, t in enumerate(items) if k not in (i, j)]
            for joined in joins(*items[i], *items[j]):
                plan = _search([*rest, joined], goal, joins, dead)
                if plan is not None:
                    return plan
    dead.add(key)
    return None


def _joins(a: Fraction, plan_a: Plan, b: Fraction, plan_b: Plan) -> list[tuple[Any, Plan]]:
    """Distinct-valued ways to combine a and b: + and * once, - and / both ways."""
    joins: dict[Fraction, Plan] = {
        a + b: (plan_a, "+", plan_b),
        a * b: (plan_a, "*", plan_b),
        a - b: (plan_a, "-", plan_b),
        b - a: (plan_b, "-", plan_a),
    }
    if b:
        joins.setdefault(a / b, (plan_a, "/", plan_b))
    if a:
        joins.setdefault(b / a, (plan_b, "/", plan_a))
    return list(joins.items())


def _whole_joins(a: int, plan_a: Plan, b: int, plan_b: Plan) -> list[tuple[Any, Plan]]:
    """Like `_joins` for whole numbers, keeping only non-negative whole results."""
    if a < b:
        a, plan_a, b, plan_b = b, plan_b, a, plan_a
    joins = {a + b: (plan_a, "+", plan_b), a * b: (plan_a, "*", plan_b)}
    joins.setdefault(a - b, (plan_a, "-", plan_b))
    if b and a % b == 0:  # (b/a is whole only when it is 0 = a*b or 1 = a/b)
        joins.setdefault(a // b, (plan_a, "/", plan_b))
    return list(joins.items())


def _write(plan: Plan) -> Term:
    if isinstance(plan, int):
        return literal(plan)
    left, symbol, right = plan
    return combine(_write(left), symbol, _write(right))
