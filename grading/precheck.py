"""4.1 The pre-check (docs/math.md, "Grading math answers"): plain arithmetic whose value cannot be
close to the gold, or cannot be computed in bounded time (a huge factorial, an exponent tower,
hundreds of nested fractions), scores 0 here, exactly, without math-verify, so that such an answer
never holds a grading worker until its CPU bound. A MathGrader (grading/pool.py) asks it first, in
the trainer's process, on the request that grading.math_answers.math_request reads.
"""
from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass
from fractions import Fraction

from grading.math_answers import MATH_ANSWER_CHARS, answer_parts, without_thousands
from rewards import Verdict

PRECHECK_BITS = 8192  # exact values are kept up to this many bits; past it, a lower bound on |x|
PRECHECK_DEPTH = 8  # brackets nested deeper stall math-verify (10 nested fractions: 0.4 s, 20: over 5 s)
_MOST_BITS = 1 << 40  # lower bounds are capped here: a smaller lower bound is still a true one


@dataclass(frozen=True)
class Huge:
    """A number known by a lower bound on its size only: |x| >= 2**bits; sign 1, -1 or 0 (unknown)."""
    bits: int
    sign: int


def precheck(request: dict) -> Verdict | None:
    """Verdict 0, reached without math-verify, on a final answer (request["answer"], as
    math_request reads it) that could stall the library -- one whose value passes PRECHECK_BITS (a
    factorial of a huge number, a tower of exponents, a long number) or which nests brackets deeper
    than PRECHECK_DEPTH (hundreds of nested fractions) -- and whose value cannot be within the
    library's tolerance of the gold's; None for every other answer (a worker grades it). Only plain
    arithmetic is read (arithmetic()), on both sides; a multi-part gold is left to the worker.

    Why no right answer is lost: it only ever says 0; arithmetic() reads an answer as the library
    does (tests/test_answers.py compares them), exactly or, past PRECHECK_BITS, by a proven lower
    bound on |x|; and it says 0 only when the exact distance to the gold is over 1/1000 of
    max(1, |gold|) or the bound puts |x| above twice |gold|, while the library takes two such
    numbers for equal only when they agree to 6 decimals (floats) or exactly (verify's
    float_rounding 6, numeric_precision 15). OlympiadBench's judge scores a power whose exponent
    is over 1000 as 0 outright (can_compute_power); this decides only what it can prove."""
    answer, gold = request["answer"], request["gold"]
    try:
        if answer is None or len(answer_parts(gold)) > 1:
            return None
        said, expected = arithmetic(answer), arithmetic(without_thousands(gold))
    except Exception:  # noqa: BLE001 - a bug here must not decide: the worker grades the answer
        return None
    if said is None or not said[1] or expected is None or isinstance(expected[0], Huge):
        return None
    return Verdict(0.0, answer) if _far(said[0], expected[0]) else None


def _far(value: Fraction | Huge, gold: Fraction) -> bool:
    """Whether value is certainly outside the library's tolerance of the gold (see precheck)."""
    if isinstance(value, Huge):
        return value.bits >= _log2_above(gold) + 1  # |value| >= 2 |gold|, and |gold| < 2**_log2_above
    return abs(value - gold) * 1000 > max(1, abs(gold))


_ARITHMETIC_TOKEN = re.compile(r"\s+|(\d+(?:\.\d+)?)|(\\[dt]?frac|\\cdot|\\times|\\div|\\left|\\right|[-+*/^!(){}])|.",
                               re.DOTALL)
_OPERATOR = {"\\cdot": "*", "\\times": "*", "\\div": "/"}
_EXACT = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}
_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2, "neg": 3, "^": 4}  # -3^2 = -(3^2), as latex2sympy reads it


def arithmetic(latex: str) -> tuple[Fraction | Huge, bool] | None:
    """(value, could it stall math-verify?) of a LaTeX answer made of decimal numbers, + - * / \\cdot
    \\times \\div, ^{...} or ^digit, \\frac{}{} (\\dfrac, \\tfrac), n!, ( ), { } and \\left( \\right);
    None for anything else or anything that reads two ways ("!!", "2^{3}!", "3!^2", "2^10", "2(3)",
    "\\frac12"). "-3^2" -> (Fraction(-9), False); "(10^{100})!" -> (Huge(...), True): the value
    passes PRECHECK_BITS, or the brackets nest deeper than PRECHECK_DEPTH. An iterative
    operator-precedence parse, each step bounded by PRECHECK_BITS: no nesting reaches Python's
    recursion limit, and any answer of MATH_ANSWER_CHARS takes milliseconds."""
    read = _arithmetic_tokens(latex)
    if read is None:
        return None
    tokens, deepest = read
    values: list = []
    ops: list[str] = []  # "(" or an operator
    expect, huge = True, False  # an operand comes next; a value passed PRECHECK_BITS

    def push(value) -> bool:
        nonlocal huge
        values.append(value)
        huge |= isinstance(value, Huge)
        return value is not None

    def reduce(op: str) -> bool:
        right = values.pop()
        return push(_apply(op, None if op == "neg" else values.pop(), right))

    for token in tokens:
        if token == "!":
            if expect or (ops and ops[-1] == "^"):
                return None  # "2^{3}!": a factorial of the exponent, or of the power?
            if not push(_factorial(values.pop())):
                return None
        elif expect:
            if isinstance(token, Fraction):
                if not push(_bounded(token)):
                    return None
                expect = False
            elif token in ("(", "-"):
                ops.append("neg" if token == "-" else "(")
            elif token != "+":  # a sign + changes nothing
                return None
        elif isinstance(token, Fraction) or token == "(":
            return None  # a product without a sign: "2(3)"
        else:  # ")" or a binary operator: first reduce what binds tighter (^ groups to the right)
            while ops and ops[-1] != "(" and (token == ")" or _PRECEDENCE[ops[-1]] > _PRECEDENCE[token]
                                              or _PRECEDENCE[ops[-1]] == _PRECEDENCE[token] != 4):
                if not reduce(ops.pop()):
                    return None
            if token != ")":
                ops.append(token)
                expect = True
            elif not ops:
                return None
            else:
                ops.pop()
    while ops and ops[-1] != "(" and not expect:
        if not reduce(ops.pop()):
            return None
    if expect or ops or len(values) != 1:
        return None
    return values[0], huge or deepest > PRECHECK_DEPTH


def _arithmetic_tokens(latex: str) -> tuple[list, int] | None:
    """The tokens of arithmetic() with the LaTeX resolved, and the deepest nesting of brackets:
    numbers as Fractions, \\frac{a}{b} as ( ( a ) / ( b ) ), { } as ( ), \\cdot and \\times as *,
    \\div as /. "\\frac{1}{2}^{3}" -> (["(", "(", 1, ")", "/", "(", 2, ")", ")", "^", "(", 3, ")"], 2).
    None where a macro lacks its braces, ^ is followed by neither { nor one digit, or ! by ! or ^."""
    tokens, braces, want, depth, deepest = [], [], "", 0, 0  # want: "frac", "denominator", "exponent"
    for match in _ARITHMETIC_TOKEN.finditer(latex):
        number, op, text = match.group(1), match.group(2), match.group()
        if text.isspace() or op in ("\\left", "\\right"):
            continue
        if (op is None and number is None) or (op in ("!", "^") and tokens[-1:] == ["!"]):
            return None  # "3!!", "3!^2": the library reads neither as arithmetic
        if want and text != "{" and not (want == "exponent" and number and len(text) == 1):
            return None
        if op in ("{", "("):
            depth += 1
            deepest = max(deepest, depth)
        if op == "{":
            braces.append(want)
            tokens += ["(", "("] if want == "frac" else ["("]
            want = ""
        elif op == "}":
            if not braces:
                return None
            tokens += [")", "/"] if braces[-1] == "frac" else [")", ")"] if braces[-1] == "denominator" else [")"]
            want = "denominator" if braces.pop() == "frac" else ""
        elif op in ("\\frac", "\\dfrac", "\\tfrac"):
            want = "frac"
        elif number and len(text) > MATH_ANSWER_CHARS:
            return None  # int() refuses 4,301 digits and more; no answer sent is this long
        else:
            tokens.append(Fraction(text) if number else _OPERATOR.get(op, op))
            want = "exponent" if op == "^" else ""
        depth -= op in ("}", ")")
    return (tokens, deepest) if not want and not braces else None


def _apply(op: str, left: Fraction | Huge | None, right: Fraction | Huge | None) -> Fraction | Huge | None:
    """left op right ("neg": -right) on exact values or Huge bounds; None when the result cannot be
    pinned down (a sum of two huge numbers, a huge divisor, a fractional exponent, x / 0)."""
    if right is None or (left is None and op != "neg"):
        return None
    if op == "neg":
        return -right if isinstance(right, Fraction) else Huge(right.bits, -right.sign)
    if op == "^":
        return _power(left, right)
    if isinstance(left, Fraction) and isinstance(right, Fraction):
        if op == "/" and right == 0:
            return None
        return _bounded(_EXACT[op](left, right))
    return _huge_arithmetic(op, left, right)


def _huge_arithmetic(op: str, left: Fraction | Huge, right: Fraction | Huge) -> Fraction | Huge | None:
    """+ - * / with a Huge side: |H ± c| >= 2**(bits - 1) when |c| < 2**(bits - 1); |H c| >= 2**bits |c|;
    |H / c| >= 2**bits / |c|; a sum of two huge numbers or a huge divisor is not pinned down."""
    if op in "+-":
        huge, small, sign = (left, right, 1) if isinstance(left, Huge) else (right, left, -1 if op == "-" else 1)
        if isinstance(small, Huge) or _log2_above(small) >= huge.bits:
            return None
        return Huge(huge.bits - 1, huge.sign * sign)
    if op == "*":
        if 0 in (left, right):
            return Fraction(0)
        if isinstance(left, Huge) and isinstance(right, Huge):
            return _huge(left.bits + right.bits, left.sign * right.sign)
        huge, small = (left, right) if isinstance(left, Huge) else (right, left)
        return _huge(huge.bits + _log2_below(small), huge.sign * (1 if small > 0 else -1))
    if isinstance(right, Huge) or right == 0:
        return None
    return _huge(left.bits - _log2_above(right), left.sign * (1 if right > 0 else -1))


def _power(base: Fraction | Huge, exponent: Fraction | Huge) -> Fraction | Huge | None:
    """base ** exponent for a whole exponent: exact within PRECHECK_BITS; else, for |base| >= 2**j
    (j >= 1) and exponent n > 0, |base**n| >= 2**(j n), and for exponent >= 2**k, >= 2**(j 2**k)
    (a positive base). None for a fractional exponent, 0 to a negative power, or a huge base to one."""
    if isinstance(exponent, Fraction) and exponent.denominator != 1:
        return None
    if isinstance(exponent, Huge):
        j = base.bits if isinstance(base, Huge) else _log2_below(base) if base > 0 else 0
        positive = exponent.sign == 1 and (base.sign == 1 if isinstance(base, Huge) else base > 0)
        return _huge(j << min(exponent.bits, 40), 1) if positive and j >= 1 else None
    n = exponent.numerator
    if isinstance(base, Huge):
        return Fraction(1) if n == 0 else _huge(base.bits * n, base.sign if n % 2 else 1) if n > 0 else None
    if base == 0 and n < 0:
        return None
    if abs(base) in (0, 1) or abs(n) * max(abs(base.numerator).bit_length(), base.denominator.bit_length()) \
            <= PRECHECK_BITS:
        return base ** n
    if n > 0 and _log2_below(base) >= 1:
        return _huge(n * _log2_below(base), 1 if base > 0 or n % 2 == 0 else -1)
    return None


def _factorial(x: Fraction | Huge | None) -> Fraction | Huge | None:
    """x! for a whole x >= 0: exact within PRECHECK_BITS (n! < n**n), else a bound from
    n! >= (n/e)**n: log2 n! >= n (log2 n - 2) >= n (bits of n - 3); for x >= 2**k, >= 2**k (k - 2)."""
    if isinstance(x, Huge):
        return _huge((1 << min(x.bits, 40)) * (x.bits - 2), 1) if x.sign == 1 else None
    if x is None or x.denominator != 1 or x < 0:
        return None
    n = x.numerator
    if n * n.bit_length() <= PRECHECK_BITS:
        return Fraction(math.factorial(n))
    return _huge(n * (n.bit_length() - 3), 1)


def _bounded(x: Fraction) -> Fraction | Huge | None:
    """x itself within PRECHECK_BITS; past them a Huge bound when |x| is that large, else None (a
    long fraction of moderate size proves nothing)."""
    if max(abs(x.numerator).bit_length(), x.denominator.bit_length()) <= PRECHECK_BITS:
        return x
    below = _log2_below(x)
    return Huge(min(below, _MOST_BITS), 1 if x > 0 else -1) if below >= PRECHECK_BITS // 2 else None


def _huge(bits: int, sign: int) -> Huge | None:
    """A Huge bound, capped at _MOST_BITS; None when the bound says less than |x| >= 2."""
    return Huge(min(bits, _MOST_BITS), sign) if bits >= 1 else None


def _log2_below(x: Fraction) -> int:
    """An integer at most log2 |x| (x != 0): |numerator| >= 2**(its bits - 1), denominator <= 2**(bits of d - 1)."""
    return abs(x.numerator).bit_length() - 1 - (x.denominator - 1).bit_length()


def _log2_above(x: Fraction) -> int:
    """An integer k with |x| < 2**k: |numerator| < 2**(its bits), denominator >= 2**(its bits - 1)."""
    return abs(x.numerator).bit_length() - x.denominator.bit_length() + 1
