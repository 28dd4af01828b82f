"""Graders and the reward plumbing: from a response to a Verdict, bounded.

Every grader reads a bounded part of a response (a model's output is hostile input) and never
raises: a grader that fails scores 0 and says why in Verdict.failure, which the trainer counts
(reward/grader_failures). Three kinds:

- built-in graders (`grade_running_sum`, `grade_countdown`), in process: they read a bounded
  window before the last </answer> and take milliseconds on any response; countdown parses the
  arithmetic itself (never Python `eval` on model output);
- HF math-verify for data files (`MathGrader`), in a worker process with a time limit: the gold
  answer is parsed first, the response's last \\boxed{} has priority, then GSM8K's "#### x", an
  <answer> tag, any LaTeX or number math-verify finds, the last number. The worker sees at most
  MATH_ANSWER_CHARS of the response;
- your own function, `--reward path/to/file.py:function` (`RewardFunction`), in worker processes
  the same way: function(prompt, response, answer) -> float, or the batch form
  function(prompts, responses, answers) -> list of floats; a reward may also be a pair (float,
  answer string) for maj@n to vote on. An exception, a return that is not a number, or a call
  past --grade-timeout scores 0 as a counted failure, and the run goes on.

Worker graders run in a pool (`GraderPool`: one slow answer holds up one worker of a batch, not
the batch) under an optional wall-clock budget per batch. `grade_batch` is what the trainer and
eval call, with the answer gate. Tasks (where problems come from) are in tasks.py.
`overlong_penalty` is the DAPO soft length penalty added to the reward when asked.
"""
from __future__ import annotations

import ast
import functools
import importlib.util
import json
import math
import numbers
import os
import queue
import re
import subprocess
import sys
import threading
import time
import unicodedata
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path


class DataError(ValueError):
    """A user-facing problem with task data: the message names the file, line and field."""


@dataclass
class Problem:
    prompt: str  # the user message, before any chat template
    answer: str  # the gold answer as a string (a code problem: which row's tests, "file:line")
    domain: str = ""  # its source's name in a mixed run (--data a,b), which grades it; "" in a run of one source


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


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_BRACES = re.compile(r"[{}]")
_BRACELESS_BOX = re.compile(r" +([^\s$]+)")  # "\\boxed 5"


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
    """A finite real number (bool and numpy scalars included): 1, 0.5, True -> True; "1", nan -> False."""
    return isinstance(value, numbers.Real) and math.isfinite(value)


def grades_safely(grade):
    """A grader function that never raises (see graded)."""
    return functools.wraps(grade)(lambda problem, response: graded(grade, problem, response))


class AnswerTooLong(ValueError):
    """A final answer longer than MATH_ANSWER_CHARS: not a sane answer, scored 0 without parsing."""


def last_boxed(text: str, max_chars: int | None = None) -> str | None:
    """Content of the last \\boxed{...} or \\fbox{...}, with nested braces, as MATH solutions write
    them: "\\boxed{\\frac{1}{2}}" -> "\\frac{1}{2}"; the brace-less "\\boxed 5" -> "5"; None when
    there is none or it is unclosed. Given max_chars, at most max_chars + 2 characters after the
    macro are read, and a box that does not end within them raises AnswerTooLong."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    i = start + (6 if text.startswith("\\boxed", start) else 5)  # after "\\boxed" / "\\fbox"
    end = len(text) if max_chars is None else min(len(text), i + max_chars + 2)  # + the braces
    if not text.startswith("{", i):
        found = _BRACELESS_BOX.match(text, i, end)
        if found and found.end() == end < len(text):  # the token may go on past what was read
            raise AnswerTooLong
        return found.group(1) if found else None
    depth = 0
    for brace in _BRACES.finditer(text, i, end):
        depth += 1 if brace.group() == "{" else -1
        if depth == 0:
            return text[i + 1:brace.start()].strip()
    if end < len(text):
        raise AnswerTooLong
    return None


def gold_answer(raw: str) -> str:
    """The gold answer from an answer/solution field: GSM8K "...#### 72" -> "72";
    a MATH solution "... \\boxed{3}" -> "3"; anything else unchanged (stripped)."""
    if "####" in raw:
        return raw.split("####")[-1].strip()
    return last_boxed(raw) or raw.strip()



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



# ----------------------------------------------------------------------------- grading workers

class _NoReply(Exception):
    """A grading worker gave no reply; `failure` says why: "timeout", "budget" or "error"."""

    def __init__(self, failure: str):
        super().__init__(failure)
        self.failure = failure


class GradingWorker:
    """A child process that grades one JSON request at a time under a wall-clock limit.

    Why a process: a grader can run unboundedly long on an adversarial answer (sympy does), and a
    time limit by SIGALRM works only on a process's main thread (not in a thread pool, a notebook
    executor, or a helper thread of a torchrun worker). A child process can be killed from any
    thread. A request that times out or crashes its worker scores 0 and says so in
    Verdict.failure (the caller counts it), and the next request starts a fresh worker. The worker
    says "ready" once it has started; its replies are Verdicts as JSON, one line each.
    """

    STARTUP_S = 120.0  # importing sympy (or your reward's modules) can take a while; not charged to answers

    def __init__(self, command: list[str], timeout: float):
        self.command, self.timeout = command, timeout
        self.start_error = ""  # what a worker that would not start said, if anything
        self._proc, self._replies, self._lock = None, None, threading.Lock()

    def ask(self, request: dict, deadline: float | None = None, limit: float | None = None):
        """(reply, "") or (None, failure) for one request, within `limit` seconds (default: the
        timeout). A `deadline` (a time.monotonic() value) that comes first cuts the wait short: a
        worker still grading is killed, and the failure is "budget"."""
        if deadline is not None and time.monotonic() >= deadline:
            return None, "budget"
        with self._lock:  # one request in flight per worker: replies are matched by order
            try:
                if self._proc is None:
                    self._start(deadline)
                self._proc.stdin.write(json.dumps(request) + "\n")  # ASCII: json escapes lone surrogates
                self._proc.stdin.flush()
                return self._reply(limit or self.timeout, deadline, "timeout"), ""
            except _NoReply as e:
                failure = e.failure
            except OSError:  # the worker could not be run, or died before reading the request
                failure = "error"
            self.close()
            return None, failure

    def start(self) -> bool:
        """Start the worker unless it runs; whether it runs. One that fails to start is reported by
        the next call (and start_error says what it said, if anything)."""
        with self._lock:
            if self._proc is None:
                try:
                    self._start(None)
                except (_NoReply, OSError):
                    self.close()
            return self._proc is not None

    def _start(self, deadline: float | None) -> None:
        proc = subprocess.Popen(self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        replies: queue.Queue = queue.Queue()

        def pump():  # a reader thread, so that waiting for a reply can time out
            for line in proc.stdout:
                try:
                    replies.put(json.loads(line))
                except json.JSONDecodeError:
                    break
            replies.put(None)

        threading.Thread(target=pump, daemon=True).start()
        self._proc, self._replies = proc, replies
        self._finalizer = weakref.finalize(self, proc.kill)  # no orphan worker at exit
        said = self._reply(self.STARTUP_S, deadline, "error")
        if said != "ready":
            self.start_error = said.get("error", "") if isinstance(said, dict) else ""
            raise _NoReply("error")

    def _reply(self, limit: float, deadline: float | None, failure: str):
        """The worker's next line. Raises _NoReply: `failure` when `limit` seconds pass, "budget"
        when `deadline` comes first, "error" when the worker exited."""
        left = limit if deadline is None else deadline - time.monotonic()
        if left < limit:
            limit, failure = max(0.0, left), "budget"
        try:
            reply = self._replies.get(timeout=limit)
        except queue.Empty:
            raise _NoReply(failure) from None
        if reply is None:
            raise _NoReply("error")
        return reply

    def close(self) -> None:
        proc, self._proc = self._proc, None  # FileTask.close may race a grading that kills its worker
        if proc is not None:
            self._finalizer()  # kills the worker (once), and forgets it at exit
            proc.wait()


def verdict(reply: dict | None, failure: str) -> Verdict:
    """A worker's reply (or the failure that stands for it) as a Verdict."""
    if reply is None:
        return Verdict(0.0, failure=failure)
    return Verdict(float(reply["reward"]), reply["answer"], reply["failure"])


class GraderPool:
    """Several grading workers driven from threads, so that a slow answer holds up one worker of a
    batch, not the batch. Each grader is called as grader(*args, deadline=...) -> Verdict."""

    def __init__(self, graders: list):
        self.graders = graders

    def grade_all(self, requests: list[tuple], budget: float = 0.0) -> list[Verdict]:
        """One Verdict per tuple of a grader's arguments, in order. A budget (seconds; 0: none)
        bounds the batch: what is not graded once it is spent scores failure "budget", a worker
        still busy is killed. Its clock starts once the workers run: a worker's first start is no
        answer's fault."""
        self.start()
        deadline = time.monotonic() + budget if budget > 0 else None
        idle: queue.SimpleQueue = queue.SimpleQueue()
        for grader in self.graders:
            idle.put(grader)

        def grade(args: tuple) -> Verdict:
            grader = idle.get()  # never waits: there are as many threads as graders
            try:
                return grader(*args, deadline=deadline)
            finally:
                idle.put(grader)

        with ThreadPoolExecutor(len(self.graders)) as threads:
            return list(threads.map(grade, requests))

    def start(self) -> None:
        """Start the stopped workers at once: each spends seconds importing its grader."""
        with ThreadPoolExecutor(len(self.graders)) as threads:
            list(threads.map(GradingWorker.start, self.graders))

    def close(self) -> None:
        for grader in self.graders:
            grader.close()


# ----------------------------------------------------------------------------- math grading

MATH_ANSWER_CHARS = 4096  # the most of a response a math worker sees: sane final answers are far shorter


class MathGrader(GradingWorker):
    """HF math-verify in a child process (a GradingWorker), one answer at a time. The worker is sent
    the answer region and the last number of the response's tail, found here in bounded time, so
    no length of response reaches sympy. `command` replaces the worker, for tests."""

    def __init__(self, timeout: float = 10.0, command: list[str] | None = None):
        super().__init__(command or [sys.executable, str(Path(__file__).resolve()), "--math-worker"], timeout)

    def __call__(self, response: str, gold: str, deadline: float | None = None) -> Verdict:
        """The verdict on one response; past the `deadline` it scores failure "budget"."""
        if deadline is not None and time.monotonic() >= deadline:
            return Verdict(0.0, failure="budget")
        try:
            request = _math_request(response, gold)
        except AnswerTooLong:
            return Verdict(0.0)
        return verdict(*self.ask(request, deadline))


class MathGraderPool(GraderPool):
    """`workers` MathGraders: a data file's grader when no --reward is given."""

    def __init__(self, timeout: float = 10.0, workers: int = 4, command: list[str] | None = None):
        super().__init__([MathGrader(timeout, command) for _ in range(workers)])

    def __call__(self, response: str, gold: str) -> Verdict:
        """One answer, on the first worker: a single grading does not start the others."""
        return self.graders[0](response, gold)

    def grade_one(self, problem: Problem, response: str) -> Verdict:
        return self(response, problem.answer)

    def grade_items(self, items: list[tuple[Problem, str]], budget: float = 0.0) -> list[Verdict]:
        return self.grade_all([(response, problem.answer) for problem, response in items], budget)


def _math_worker() -> None:
    """The child side of MathGrader: `_math_request` JSON lines in, Verdict JSON lines out."""
    import logging

    import math_verify
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeout disabled": the parent times us
    _math_verdict(math_verify, "\\boxed{1}", None, "1")  # a first grading is slow: no answer's fault
    print(json.dumps("ready"), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        try:
            reward, answer = _math_verdict(math_verify, **request)
            reply = {"reward": reward, "answer": answer, "failure": ""}
        except Exception:  # noqa: BLE001 - any grader crash scores 0 and is counted, never kills the run
            reply = {"reward": 0.0, "answer": None, "failure": "error"}
        print(json.dumps(reply), flush=True)


def _math_verdict(mv, region: str, number: str | None, gold: str) -> tuple[float, str | None]:
    """(reward, normalised answer) from a response's answer region, else its last number;
    mv is the math_verify module."""
    configs = [mv.LatexExtractionConfig(boxed_match_priority=0), mv.ExprExtractionConfig()]

    def parse(text: str) -> list:
        return mv.parse(text, extraction_config=configs, parsing_timeout=None)

    gold_parsed = parse("\\boxed{" + gold + "}")  # gold first: math-verify treats it as the reference
    pred = parse(region) or (parse(number) if number else [])
    if not pred:
        return 0.0, None
    answer = str(pred[0])
    if not gold_parsed:  # a gold answer math-verify cannot read: exact text match
        return float(pred[-1].strip() == gold.strip()), answer
    return float(mv.verify(gold_parsed, pred, timeout_seconds=None)), answer


def _math_request(response: str, gold: str) -> dict:
    """What a math worker is sent of a response: its answer region, and the last number of its
    tail for when the region holds no answer math-verify can read."""
    numbers = _NUMBER.findall(_tail(response, MATH_ANSWER_CHARS))
    return {"region": _answer_region(response), "gold": gold,
            "number": numbers[-1].replace(",", "") if numbers else None}


def _answer_region(response: str) -> str:
    """Where the final answer is: the last \\boxed{} (alone: math-verify would join "\\boxed{5}, ...
    \\boxed{7}" into the set {5, 7}, and a self-corrected trace would score 0), else the line after
    GSM8K's "####", else an <answer> tag's content, else the end of the text: at most about
    MATH_ANSWER_CHARS, found in linear time. A box, line or tag longer raises AnswerTooLong."""
    boxed = last_boxed(response, MATH_ANSWER_CHARS)
    if boxed is not None:
        return "\\boxed{" + boxed + "}"
    hashes = response.rfind("####")
    if hashes >= 0:
        return _short(response[hashes + 4:].strip().partition("\n")[0])
    tag = extract_tag(response)
    if tag is not None:
        return "$" + _short(tag) + "$"
    return _tail(response, MATH_ANSWER_CHARS)


def _short(answer: str) -> str:
    if len(answer) > MATH_ANSWER_CHARS:
        raise AnswerTooLong
    return answer


def _tail(text: str, chars: int) -> str:
    """The last `chars` characters of text at most, from a word boundary (a number cut in two
    would be another number): _tail("so x is 1234", 6) -> "1234"; "" when no boundary is in them."""
    if len(text) <= chars:
        return text
    tail = text[-chars - 1:]
    space = re.search(r"\s", tail)
    return tail[space.end():] if space else ""


# ----------------------------------------------------------------------------- --reward file.py:function

class RewardFunction(GraderPool):
    """Your reward function, `--reward path/to/file.py:function`, run like math-verify: in `workers`
    processes (GradingWorker), `timeout` seconds a response. The file is never imported into the
    trainer: its code runs only in the workers, whose stdout carries the replies (your prints go to
    stderr). A parameter list (prompt, response, answer) is called per response; (prompts,
    responses, answers) once per batch, in one worker, within timeout × the batch's size."""

    def __init__(self, spec: str, timeout: float = 10.0, workers: int = 4):
        path, name, self.batch = reward_signature(spec)
        command = [sys.executable, str(Path(__file__).resolve()), "--reward-worker", str(path), name,
                   "batch" if self.batch else "row"]
        super().__init__([RewardWorker(command, timeout) for _ in range(1 if self.batch else workers)])
        self.spec = spec
        self.check()

    def check(self) -> None:
        """Start one worker now, so that a file that does not import fails before any model loads."""
        first = self.graders[0]
        if not first.start():
            raise DataError(f"--reward {self.spec}: its worker did not start: "
                            f"{first.start_error or 'see the error above'}")

    def grade_one(self, problem: Problem, response: str) -> Verdict:
        return self.grade_items([(problem, response)])[0]

    def grade_items(self, items: list[tuple[Problem, str]], budget: float = 0.0) -> list[Verdict]:
        rows = [(problem.prompt, response, problem.answer) for problem, response in items]
        if not self.batch:
            return self.grade_all(rows, budget)
        self.start()  # as grade_all: the budget's clock starts once the worker runs
        deadline = time.monotonic() + budget if budget > 0 else None
        return self.graders[0].batch(rows, deadline)


class RewardWorker(GradingWorker):
    """One worker process of a RewardFunction."""

    def __call__(self, prompt: str, response: str, answer: str, deadline: float | None = None) -> Verdict:
        return verdict(*self.ask({"rows": [[prompt, response, answer]]}, deadline))

    def batch(self, rows: list[tuple[str, str, str]], deadline: float | None) -> list[Verdict]:
        """All rows in one request, one call of a batch-form function."""
        reply, failure = self.ask({"rows": rows}, deadline, limit=self.timeout * max(len(rows), 1))
        return [verdict(r, failure) for r in (reply["verdicts"] if reply else [None] * len(rows))]


def plugin_spec(value: str) -> tuple[Path, str] | None:
    """"path/to/file.py:name" -> (Path("path/to/file.py"), "name"); anything else -> None."""
    path, _, name = value.rpartition(":")
    return (Path(path), name) if path.endswith(".py") and name.isidentifier() else None


def reward_signature(spec: str) -> tuple[Path, str, bool]:
    """(file, function name, batch form?) of a --reward value, read from the file's syntax without
    running it: a top-level def with the parameters (prompt, response, answer) or (prompts,
    responses, answers). Every problem is a DataError naming the file."""
    found = plugin_spec(spec)
    if found is None:
        raise DataError(f"--reward {spec!r}: give path/to/file.py:function")
    path, name = found
    if not path.is_file():
        raise DataError(f"--reward {spec}: no such file {path}")
    try:
        tree = ast.parse(path.read_text(), filename=str(path))
    except (SyntaxError, UnicodeDecodeError) as e:
        raise DataError(f"--reward {spec}: {path} is not valid Python ({e})") from None
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    if not defs:
        raise DataError(f"--reward {spec}: {path} has no top-level function {name}")
    params = [a.arg for a in defs[-1].args.posonlyargs + defs[-1].args.args]
    if params not in (list(REWARD_PARAMS), list(BATCH_PARAMS)):
        raise DataError(f"--reward {spec}: {name}({', '.join(params)}) must take ({', '.join(REWARD_PARAMS)}) "
                        f"or, for a whole batch at once, ({', '.join(BATCH_PARAMS)})")
    return path, name, params == list(BATCH_PARAMS)


REWARD_PARAMS = ("prompt", "response", "answer")
BATCH_PARAMS = ("prompts", "responses", "answers")


def _reward_worker(path: str, name: str, form: str) -> None:
    """The child side of RewardFunction: {"rows": [[prompt, response, answer], ...]} JSON lines in,
    a Verdict (form "row": one row a call) or {"verdicts": [...]} (form "batch") out."""
    replies = os.fdopen(os.dup(1), "w")  # the protocol keeps the real stdout; the function's prints go to stderr
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        module_spec = importlib.util.spec_from_file_location("rlvr_reward", path)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        function = getattr(module, name)
    except Exception as e:  # noqa: BLE001 - reported to the parent, which names the file
        print(json.dumps({"error": f"importing {path} failed: {type(e).__name__}: {e}"}), file=replies, flush=True)
        return
    print(json.dumps("ready"), file=replies, flush=True)
    for line in sys.stdin:
        rows = json.loads(line)["rows"]
        if form == "batch":
            reply = {"verdicts": _scores(lambda: function(*map(list, zip(*rows))), len(rows))}
        else:
            reply = _scores(lambda: [function(*rows[0])], 1)[0]
        print(json.dumps(reply), file=replies, flush=True)


def _scores(call, n: int) -> list[dict]:
    """The n Verdicts (as dicts) of what call() returns: a list of n rewards, each a number or
    (number, answer) for maj@n to vote on; an exception or a list of another length fails every
    row, anything else its own row. [0.5, (1, "42"), "1"] -> rewards 0.5, 1.0 (answer "42"), 0 ("error")."""
    try:
        values = list(call())
    except Exception:  # noqa: BLE001 - a reward bug on one batch must not kill training
        values = None
    if values is None or len(values) != n:
        values = [None] * n
    out = []
    for v in values:
        reward, answer = v if isinstance(v, tuple) and len(v) == 2 else (v, None)
        ok = is_reward(reward) and (answer is None or isinstance(answer, str))
        out.append({"reward": float(reward) if ok else 0.0, "answer": answer if ok else None,
                    "failure": "" if ok else "error"})
    return out


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


if __name__ == "__main__" and sys.argv[1:2] == ["--math-worker"]:
    _math_worker()
if __name__ == "__main__" and sys.argv[1:2] == ["--reward-worker"]:
    _reward_worker(*sys.argv[2:5])
