"""The countdown task (`--data countdown`, CountdownTask), its grader and the arithmetic it reads:
`parse_arithmetic`, a hand-written parser of + - * / ( ) over integers, exact and bounded, never Python's
eval on model output (the calculator tool, environments/tools.py, evaluates with it too). Imported only by
a run that trains on or grades countdown or calls the calculator, so the default run's reader never meets it.
"""
from __future__ import annotations

import json
import random
import re
from fractions import Fraction

from rewards import Problem, Verdict, answer_window, extract_tag, grades_safely
from tasks import Task

# a correct countdown equation of four numbers below 100 is some 20 characters; 1,024 leaves room
# for spaces and bounds the parser's work
COUNTDOWN_ANSWER_CHARS = 1024


@grades_safely
def grade_countdown(problem: Problem, response: str) -> Verdict:
    """The last <answer> must use each given number once and reach the target; problem.answer is
    {"numbers": [...], "target": n} as JSON."""
    gold = json.loads(problem.answer)
    expr = extract_tag(answer_window(response, COUNTDOWN_ANSWER_CHARS))
    if expr is None:
        return Verdict(0.0)
    try:
        value, used = parse_arithmetic(expr)
    except ExpressionError:
        return Verdict(0.0, expr)
    # maj@n votes on the expression: two different correct equations are different answers
    return Verdict(float(sorted(used) == sorted(gold["numbers"]) and value == gold["target"]),
                   expr.replace(" ", ""))


COUNTDOWN_PROMPT = (
    "Using the numbers {nums}, create an equation that equals {target}. You can use basic "
    "arithmetic operations (+, -, *, /) and each number can only be used once. Show your work "
    "in <think> </think> tags. And return the final answer in <answer> </answer> tags, for "
    "example <answer> (1 + 2) / 3 </answer>.")


class CountdownTask(Task):
    """TinyZero countdown: 3-4 numbers in 1..99 and a target reachable with each used once."""

    name = "countdown"

    def sample(self, rng: random.Random) -> tuple[Problem, list[int]]:
        while True:
            nums = [rng.randint(1, 99) for _ in range(rng.randint(3, 4))]
            vals = [Fraction(n) for n in nums]
            while len(vals) > 1:  # combine two random values until one is left
                a, b = vals.pop(rng.randrange(len(vals))), vals.pop(rng.randrange(len(vals)))
                op = rng.choice("+-*/" if b else "+-*")
                vals.append({"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else 0}[op])
            target = vals[0]
            if target.denominator == 1 and 0 < target < 1000:
                prompt = COUNTDOWN_PROMPT.format(nums=nums, target=int(target))
                return Problem(prompt=prompt, answer=json.dumps({"numbers": nums,
                                                                  "target": int(target)})), nums

    def grade(self, problem: Problem, response: str) -> Verdict:
        return grade_countdown(problem, response)


class ExpressionError(ValueError):
    pass


# Bounds that keep parsing a hostile expression fast and off Python's recursion limit. A correct
# countdown answer combines four numbers below 100: at most a few levels of parentheses, and no
# numerator or denominator above 99**4 (27 bits) at any step.
MAX_NESTING = 64  # parentheses plus unary minus signs open at once
MAX_LITERAL_CHARS = 100  # digits in one number (int() is quadratic and refuses 4,301+)
MAX_BITS = 256  # of any numerator or denominator: a chain of products cannot grow without end


def parse_arithmetic(expr: str) -> tuple[Fraction, list[int]]:
    """Evaluate + - * / ( ) over integers exactly, returning (value, integers used).

    "(1 + 2) / 3" -> (Fraction(1), [1, 2, 3]). Raises ExpressionError on anything else,
    including division by zero and going past MAX_NESTING, MAX_LITERAL_CHARS or MAX_BITS.
    A hand-written recursive-descent parser: model output is never passed to Python's eval.
    """
    tokens = re.findall(r"\d+|[-+*/()]|\S", expr)
    pos, used = 0, []

    def peek():
        return tokens[pos] if pos < len(tokens) else None

    def take():
        nonlocal pos
        pos += 1
        return tokens[pos - 1]

    def bounded(val: Fraction) -> Fraction:
        if max(val.numerator.bit_length(), val.denominator.bit_length()) > MAX_BITS:
            raise ExpressionError("number too large")
        return val

    def atom(depth: int) -> Fraction:
        tok = take() if peek() is not None else None
        if tok is None:
            raise ExpressionError("unexpected end")
        if depth > MAX_NESTING:
            raise ExpressionError("nested too deep")
        if tok == "-":
            return -atom(depth + 1)
        if tok == "(":
            val = expression(depth + 1)
            if peek() != ")":
                raise ExpressionError("missing )")
            take()
            return val
        if tok.isdecimal():  # not isdigit(): "²" is a digit that int() refuses
            if len(tok) > MAX_LITERAL_CHARS:
                raise ExpressionError("number too long")
            used.append(int(tok))
            return bounded(Fraction(int(tok)))
        raise ExpressionError(f"unexpected {tok!r}")

    def term(depth: int) -> Fraction:
        val = atom(depth)
        while peek() in ("*", "/"):
            op, rhs = take(), atom(depth)
            if op == "/" and rhs == 0:
                raise ExpressionError("division by zero")
            val = bounded(val * rhs if op == "*" else val / rhs)
        return val

    def expression(depth: int) -> Fraction:
        val = term(depth)
        while peek() in ("+", "-"):
            op, rhs = take(), term(depth)
            val = bounded(val + rhs if op == "+" else val - rhs)
        return val

    value = expression(0)
    if pos != len(tokens):
        raise ExpressionError(f"trailing {tokens[pos]!r}")
    return value, used
