"""Graders and the reward plumbing: from a response to a Verdict, bounded.

Every grader reads a bounded part of a response (a model's output is hostile input) and never
raises: a grader that fails scores 0 and says why in Verdict.failure, which the trainer counts
(reward/grader_failures). Three kinds:

- built-in graders, in process: they read a bounded window before the last </answer> and take
  milliseconds on any response: `grade_running_sum` here, and countdown's in grading/countdown.py
  (imported only for it), which parses the arithmetic itself (never Python `eval` on model output);
- HF math-verify for data files (grading.pool.MathGraderPool), in worker processes with a time
  limit: the response's last \\boxed{} has priority, then GSM8K's "#### x", an <answer> tag, a
  final-answer statement ("Answer: x", "The answer is x"), a closing **x**, any LaTeX or number
  math-verify finds, the last number standing alone; the gold decides how the answer is read (a
  gold of several parts, a time of day, a letter as a variable), and an answer that would stall
  the library is decided without it when it cannot be right (grading/precheck.py). The rules and
  their sources: grading/math_answers.py and docs/math.md, "Grading math answers". The worker sees at most
  math_answers.MATH_ANSWER_CHARS of the response;
- your own function, `--reward path/to/file.py:function` (grading.pool.RewardFunction), in worker
  processes the same way: function(prompt, response, answer) -> float, or the batch form
  function(prompts, responses, answers) -> list of floats; a reward may also be a pair (float,
  answer string) for maj@n to vote on. An exception, a return that is not a number, or a call
  past --grade-timeout scores 0 as a counted failure, and the run goes on.

The worker processes, and the pool that drives them under a budget per batch, are in
grading/pool.py. `grade_batch` is what the trainer and eval call, with the answer gate. Tasks
(where problems come from) are in tasks.py. `overlong_penalty` is the DAPO soft length penalty
added to the reward when asked.
"""
from __future__ import annotations

import functools
import math
import numbers
import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path


class DataError(ValueError):
    """A user-facing problem with task data: the message names the file, line and field."""


@dataclass
class Problem:
    prompt: str  # the user message, before any chat template
    answer: str  # the gold answer as a string (a code problem: which row's tests, "file:line")
    domain: str = ""  # its source's name in a mixed run (--data a,b), which grades it; "" in a run of one source
    id: str = ""  # the row's own id in its data file (its id, idx or unique_id field), "" where it has none
    turns: tuple = ()  # the chat before the prompt, {"role", "content"} each: a data row's own, or --system-prompt's


# ----------------------------------------------------------------------------- answer tags

def extract_tag(text: str, tag: str = "answer") -> str | None:
    """Content of the last <tag>...</tag>, stripped: "a <answer> 7 </answer>" -> "7".

    The content follows the last opening tag before the last closing tag, so a stray opening tag
    earlier cannot swallow the answer: "<answer>x <answer>7</answer>" -> "7". Two rfind calls:
    linear in len(text) on any input (a regex over a run of unclosed tags was quadratic).
    """
    end = text.rfind(f"</{tag}>")
    start = text.rfind(f"<{tag}>", 0, max(end, 0))
    if start < 0:
        return None
    return text[start + len(tag) + 2:end].strip()


def answer_window(response: str, chars: int, tag: str = "answer") -> str:
    """The part of a response that can hold its last <tag> pair, at most `chars` characters
    before the last closing tag: a model's output is hostile input, so graders look at a bounded
    slice. Nothing after the last closing tag can change the last pair, so it is dropped; a pair
    that starts more than `chars` before that closing tag is not a sane answer and is cut.
    answer_window("think... <answer>54</answer> more", 12) -> ". <answer>54</answer>"."""
    end = response.rfind(f"</{tag}>")
    if end < 0:
        return ""
    return response[max(0, end - chars):end + len(tag) + 3]


@dataclass
class Verdict:
    """A grader's decision on one response."""
    reward: float  # 1.0 correct, else 0.0
    answer: str | None = None  # the extracted final answer, normalised; maj@n votes on it
    failure: str = ""  # "timeout", "budget" or "error" when the grader could not decide (reward 0)
    details: dict = field(default_factory=dict)  # numbers the trainer and eval average over responses,
    #                                              logged under their key: {"code/tests_passed": 0.5}


def graded(grade, problem: Problem, response: str) -> Verdict:
    """grade(problem, response) as a Verdict, never raising: a plain number is the reward; an
    exception, or anything but a Verdict or a number, scores 0 with failure "error" (counted in
    reward/grader_failures) instead of ending the run."""
    try:
        verdict = grade(problem, response)
    except Exception:  # noqa: BLE001 - a grader bug on one response must not kill training
        return Verdict(0.0, failure="error")
    if isinstance(verdict, Verdict):
        return verdict
    return Verdict(float(verdict)) if is_reward(verdict) else Verdict(0.0, failure="error")


def is_reward(value) -> bool:
    """A finite real number (bool and numpy scalars included): 1, 0.5, True -> True; "1", nan, 10**400
    (past a float's range) -> False."""
    try:
        return isinstance(value, numbers.Real) and math.isfinite(value)
    except OverflowError:  # math.isfinite of an int too large for a float
        return False


def grades_safely(grade):
    """A grader function that never raises (see graded)."""
    return functools.wraps(grade)(lambda problem, response: graded(grade, problem, response))


# ----------------------------------------------------------------------------- built-in graders

# str(int) refuses more than 4,300 digits (sys.int_info), so no gold sum is longer; twice that
# leaves room for spaces around it
RUNNING_SUM_ANSWER_CHARS = 8192


@grades_safely
def grade_running_sum(problem: Problem, response: str) -> Verdict:
    """The last <answer> must be an integer equal to the sum: "12+7=19 19+35=54 <answer>54</answer>"."""
    pred = extract_tag(answer_window(response, RUNNING_SUM_ANSWER_CHARS))
    if pred is None or re.fullmatch(r"-?\d+", pred) is None:
        return Verdict(0.0, pred)
    answer = canonical_integer(pred)
    return Verdict(float(answer == canonical_integer(problem.answer)), answer)


def canonical_integer(digits: str) -> str:
    """An integer written as `-?\\d+` in the form str(int(x)) gives, without int(), which is
    quadratic and refuses more than 4,300 digits: "-007" -> "-7", "-0" -> "0", "١٢" -> "12"
    (\\d and int() accept any Unicode decimal digit, so the grader keeps accepting them)."""
    sign, digits = ("-", digits[1:]) if digits.startswith("-") else ("", digits)
    digits = "".join(str(unicodedata.decimal(c)) for c in digits).lstrip("0")
    return sign + digits if digits else "0"


# ----------------------------------------------------------------------------- plugins

# --data path/to/file.py:Class (tasks.py) and --reward path/to/file.py:function (grading/pool.py)
def plugin_spec(value: str) -> tuple[Path, str] | None:
    """"path/to/file.py:name" -> (Path("path/to/file.py"), "name"); anything else -> None."""
    path, _, name = value.rpartition(":")
    return (Path(path), name) if path.endswith(".py") and name.isidentifier() else None


# ----------------------------------------------------------------------------- the trainer's entry point

def grade_batch(task, items: list[tuple[Problem, str]], budget: float = 0.0,
                answer_after: str = "") -> list[Verdict]:
    """One Verdict per (problem, response), in order: task.grade_batch (tasks.Task) within `budget`
    seconds for the whole batch (0: the task's own budget). A data file's workers grade in
    parallel, and what the budget leaves ungraded scores 0 with failure "budget"; the built-in
    graders take milliseconds on any response, so they grade in order.

    answer_after: the answer gate of the Delethink recipe (its official reward reads only what
    follows the first "</think>"): the grader sees the text after the gate's first occurrence,
    and a response without the gate scores 0 ungraded. "x=41 </think> so \\boxed{42}" -> "so
    \\boxed{42}"; "6 times 7 is 42. Wait, but" (a trace cut at the chunk cap) -> 0."""
    if answer_after:
        gated = [(p, r.split(answer_after, 1)[1]) if answer_after in r else None for p, r in items]
        verdicts = iter(grade_batch(task, [g for g in gated if g], budget))
        return [next(verdicts) if g else Verdict(0.0) for g in gated]
    return task.grade_batch(items, budget or task.budget)


def overlong_penalty(length: int, max_len: int, cache: int) -> float:
    """DAPO soft overlong penalty: 0 up to max_len - cache, then linear to -1 at max_len, -1 beyond.
    max_len 20, cache 4: length 16 -> 0.0, 18 -> -0.5, 20 -> -1.0, 25 -> -1.0."""
    start = max_len - cache
    if length <= start:
        return 0.0
    return max(-1.0, (start - length) / cache)
