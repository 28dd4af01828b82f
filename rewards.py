"""Tasks, answer extraction and verifiable graders.

A task turns a split name into a list of `Problem`s and grades a response text against one.
Three kinds:

- `running_sum` (built-in): "Add 12+7+35" -> scratchpad of partial sums, answer in a tag:
  "12+7=19 19+35=54 <answer>54</answer>". Knobs: number of terms, digits per term, so traces
  can be made as long as Markovian-thinking experiments need.
- `countdown` (built-in, TinyZero format): reach a target with each given number used once;
  the grader parses the arithmetic itself (never Python `eval` on model output).
- a JSONL file: prompt from `prompt`/`problem`/`question`, gold answer from
  `answer`/`ground_truth`/`solution` (GSM8K "#### x" and the last \\boxed{x} are extracted).

Rewards are 0/1. `overlong_penalty` is the DAPO soft length penalty added on top when asked.
"""
from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

BUILTIN_TASKS = ("running_sum", "countdown")
PROMPT_FIELDS = ("prompt", "problem", "question")
ANSWER_FIELDS = ("answer", "ground_truth", "solution")
TRAIN_SIZE, HELDOUT_SIZE = 20000, 500  # built-in splits; held-out prompts never appear in train


class DataError(ValueError):
    """A user-facing problem with task data: the message names the file, line and field."""


@dataclass
class Problem:
    prompt: str  # the user message, before any chat template
    answer: str  # the gold answer as a string


# ----------------------------------------------------------------------------- answer tags

def extract_tag(text: str, tag: str = "answer") -> str | None:
    """Content of the last <tag>...</tag>, stripped: "a <answer> 7 </answer>" -> "7"."""
    found = re.findall(rf"<{tag}>(.*?)</{tag}>", text, flags=re.DOTALL)
    return found[-1].strip() if found else None


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...}, with nested braces: "\\boxed{\\frac{1}{2}}" -> "\\frac{1}{2}"."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i, depth = start + len("\\boxed{"), 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j].strip()
    return None


def gold_answer(raw: str) -> str:
    """The gold answer from an answer/solution field: GSM8K "...#### 72" -> "72";
    a MATH solution "... \\boxed{3}" -> "3"; anything else unchanged (stripped)."""
    if "####" in raw:
        return raw.split("####")[-1].strip()
    return last_boxed(raw) or raw.strip()


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def _normalise(ans: str) -> str | Fraction:
    """A numeric answer as an exact Fraction ("1,000" -> 1000, "0.5" -> 1/2), else a bare string."""
    s = ans.strip().strip("$").rstrip(".").replace(" ", "")
    if re.fullmatch(r"-?\d[\d,]*(\.\d+)?", s):
        return Fraction(s.replace(",", ""))
    m = re.fullmatch(r"\\d?frac\{(-?\d+)\}\{(\d+)\}", s)
    if m and int(m.group(2)) != 0:
        return Fraction(int(m.group(1)), int(m.group(2)))
    return s


def grade_math(response: str, gold: str) -> float:
    """1.0 if the response's final answer equals the gold one. The answer is read from the last
    \\boxed{}, else "#### x", else <answer> tags, else the last number in the text."""
    pred = last_boxed(response)
    if pred is None and "####" in response:
        pred = response.split("####")[-1].strip()
    if pred is None:
        pred = extract_tag(response)
    if pred is None:
        numbers = _NUMBER.findall(response)
        pred = numbers[-1] if numbers else None
    return float(pred is not None and _normalise(pred) == _normalise(gold))


# ----------------------------------------------------------------------------- running sum

class RunningSumTask:
    """Add a list of integers; the response writes the partial sums, then the answer.

    "Add 12+7+35" -> "12+7=19 19+35=54 <answer>54</answer>"
    """

    name = "running_sum"

    def __init__(self, min_terms: int = 3, max_terms: int = 5, digits: int = 2):
        if not 2 <= min_terms <= max_terms or digits < 1:
            raise DataError(f"running_sum: need 2 <= sum_min_terms ({min_terms}) <= sum_max_terms "
                            f"({max_terms}) and sum_digits ({digits}) >= 1")
        self.min_terms, self.max_terms, self.digits = min_terms, max_terms, digits

    def sample(self, rng: random.Random) -> tuple[Problem, list[int]]:
        n = rng.randint(self.min_terms, self.max_terms)
        terms = [rng.randint(1, 10 ** self.digits - 1) for _ in range(n)]
        return Problem(prompt="Add " + "+".join(map(str, terms)), answer=str(sum(terms))), terms

    @staticmethod
    def solution(terms: list[int]) -> str:
        """The reference response, used to pre-train the shipped tiny model."""
        steps, total = [], terms[0]
        for t in terms[1:]:
            steps.append(f"{total}+{t}={total + t}")
            total += t
        return " ".join(steps) + f" <answer>{total}</answer>"

    def grade(self, problem: Problem, response: str) -> float:
        pred = extract_tag(response)
        return float(pred is not None and re.fullmatch(r"-?\d+", pred) is not None
                     and int(pred) == int(problem.answer))


# ----------------------------------------------------------------------------- countdown

COUNTDOWN_PROMPT = (
    "Using the numbers {nums}, create an equation that equals {target}. You can use basic "
    "arithmetic operations (+, -, *, /) and each number can only be used once. Show your work "
    "in <think> </think> tags. And return the final answer in <answer> </answer> tags, for "
    "example <answer> (1 + 2) / 3 </answer>.")


class ExpressionError(ValueError):
    pass


def parse_arithmetic(expr: str) -> tuple[Fraction, list[int]]:
    """Evaluate + - * / ( ) over integers exactly, returning (value, integers used).

    "(1 + 2) / 3" -> (Fraction(1), [1, 2, 3]). Raises ExpressionError on anything else,
    including division by zero. A hand-written recursive-descent parser: model output is
    never passed to Python's eval.
    """
    tokens = re.findall(r"\d+|[-+*/()]|\S", expr)
    pos, used = 0, []

    def peek():
        return tokens[pos] if pos < len(tokens) else None

    def take():
        nonlocal pos
        pos += 1
        return tokens[pos - 1]

    def atom() -> Fraction:
        tok = take() if peek() is not None else None
        if tok is None:
            raise ExpressionError("unexpected end")
        if tok == "-":
            return -atom()
        if tok == "(":
            val = expression()
            if peek() != ")":
                raise ExpressionError("missing )")
            take()
            return val
        if tok.isdigit():
            used.append(int(tok))
            return Fraction(int(tok))
        raise ExpressionError(f"unexpected {tok!r}")

    def term() -> Fraction:
        val = atom()
        while peek() in ("*", "/"):
            op, rhs = take(), atom()
            if op == "/" and rhs == 0:
                raise ExpressionError("division by zero")
            val = val * rhs if op == "*" else val / rhs
        return val

    def expression() -> Fraction:
        val = term()
        while peek() in ("+", "-"):
            op, rhs = take(), term()
            val = val + rhs if op == "+" else val - rhs
        return val

    value = expression()
    if pos != len(tokens):
        raise ExpressionError(f"trailing {tokens[pos]!r}")
    return value, used


class CountdownTask:
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

    def grade(self, problem: Problem, response: str) -> float:
        gold = json.loads(problem.answer)
        expr = extract_tag(response)
        if expr is None:
            return 0.0
        try:
            value, used = parse_arithmetic(expr)
        except ExpressionError:
            return 0.0
        return float(sorted(used) == sorted(gold["numbers"]) and value == gold["target"])


# ----------------------------------------------------------------------------- files

class FileTask:
    """Problems from a JSONL file; graded by final-answer equality (`grade_math`)."""

    name = "file"

    def __init__(self, path: str):
        self.path = path
        self.problems = load_jsonl(path)

    def grade(self, problem: Problem, response: str) -> float:
        return grade_math(response, problem.answer)


def load_jsonl(path: str) -> list[Problem]:
    """Read problems from JSONL; every error names the file, the line and the field."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{path}: no such file (give --data running_sum, countdown, or a .jsonl path)")
    problems = []
    with p.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{lineno}: not valid JSON ({e.msg}); each line must be "
                                f"one JSON object") from None
            if not isinstance(row, dict):
                raise DataError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            problems.append(Problem(prompt=_field(row, PROMPT_FIELDS, path, lineno),
                                    answer=gold_answer(_field(row, ANSWER_FIELDS, path, lineno))))
    if not problems:
        raise DataError(f"{path}: the dataset is empty (no JSON lines)")
    return problems


def _field(row: dict, names: tuple[str, ...], path: str, lineno: int) -> str:
    for name in names:
        if name in row:
            value = row[name]
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                value = str(value)
            if not isinstance(value, str) or not value.strip():
                raise DataError(f"{path}:{lineno}: field '{name}' must be a non-empty string")
            return value
    raise DataError(f"{path}:{lineno}: missing field: expected one of {', '.join(names)}; "
                    f"the line has {', '.join(sorted(row)) or 'no fields'}")


# ----------------------------------------------------------------------------- splits

def make_task(data: str, *, sum_min_terms: int = 3, sum_max_terms: int = 5, sum_digits: int = 2):
    if data == "running_sum":
        return RunningSumTask(sum_min_terms, sum_max_terms, sum_digits)
    if data == "countdown":
        return CountdownTask()
    if data.endswith(".jsonl") or Path(data).exists():
        return FileTask(data)
    raise DataError(f"--data {data!r}: not a built-in task ({', '.join(BUILTIN_TASKS)}) "
                    f"nor a .jsonl file")


def builtin_splits(task, seed: int = 0) -> tuple[list[Problem], list[Problem]]:
    """Seeded (train, held-out) splits of a built-in task; held-out prompts are kept out of train.
    The held-out split depends on the task knobs only, never on the run's seed."""
    held_rng, train_rng = random.Random(f"{task.name}-heldout"), random.Random(f"{task.name}-{seed}")
    heldout = [task.sample(held_rng)[0] for _ in range(HELDOUT_SIZE)]
    seen = {p.prompt for p in heldout}
    train = []
    while len(train) < TRAIN_SIZE:
        p = task.sample(train_rng)[0]
        if p.prompt not in seen:
            train.append(p)
    return train, heldout


def overlong_penalty(length: int, max_len: int, cache: int) -> float:
    """DAPO soft overlong penalty: 0 up to max_len - cache, then linear to -1 at max_len, -1 beyond.
    max_len 20, cache 4: length 16 -> 0.0, 18 -> -0.5, 20 -> -1.0, 25 -> -1.0."""
    start = max_len - cache
    if length <= start:
        return 0.0
    return max(-1.0, (start - length) / cache)
