"""Tasks, answer extraction and verifiable graders.

A task turns a split name into a list of `Problem`s and grades a response text against one,
returning a `Verdict` (the 0/1 reward and the extracted answer, which maj@n votes on).
Three kinds:

- `running_sum` (built-in): "Add 12+7+35" -> scratchpad of partial sums, answer in a tag:
  "12+7=19 19+35=54 <answer>54</answer>". Knobs: number of terms, digits per term, so traces
  can be made as long as Markovian-thinking experiments need.
- `countdown` (built-in, TinyZero format): reach a target with each given number used once;
  the grader parses the arithmetic itself (never Python `eval` on model output).
- a benchmark file (JSONL, JSON list, or parquet when pyarrow is installed) in the usual schemas:
  GSM8K question/answer ("#### x"), MATH500 problem/answer/solution, AIME/AMC problem or
  question with answer. Graded by HF math-verify (`MathGrader`) in a worker process with a time
  limit: the gold answer is parsed first, the response's last \\boxed{} has priority, then
  GSM8K's "#### x", an <answer> tag, any LaTeX or number math-verify finds, the last number.
  The worker sees at most MATH_ANSWER_CHARS of the response. `grade_batch` grades a batch with a
  pool of workers (one slow answer holds up one worker) under an optional wall-clock budget.

Rewards are 0/1. `overlong_penalty` is the DAPO soft length penalty added on top when asked.
"""
from __future__ import annotations

import functools
import importlib.util
import json
import queue
import random
import re
import subprocess
import sys
import threading
import time
import unicodedata
import weakref
from concurrent.futures import ThreadPoolExecutor
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


def grades_safely(grade):
    """Wrap a task's grade(problem, response) so that any exception scores 0 with
    Verdict.failure "error" (counted in reward/grader_failures) instead of ending the run."""
    @functools.wraps(grade)
    def wrapped(self, problem: Problem, response: str) -> Verdict:
        try:
            return grade(self, problem, response)
        except Exception:  # noqa: BLE001 - a grader bug on one response must not kill training
            return Verdict(0.0, failure="error")
    return wrapped


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


# ----------------------------------------------------------------------------- math grading

MATH_ANSWER_CHARS = 4096  # the most of a response a math worker sees: sane final answers are far shorter


class _NoReply(Exception):
    """A math worker gave no reply; `failure` says why: "timeout", "budget" or "error"."""

    def __init__(self, failure: str):
        super().__init__(failure)
        self.failure = failure


class MathGrader:
    """HF math-verify in a child process, one answer at a time under a wall-clock limit.

    Why a process: sympy can run unboundedly long on an adversarial answer, and math-verify's own
    limit is SIGALRM, which works only on a process's main thread (not in a thread pool, a
    notebook executor, or a helper thread of a torchrun worker). A child process can be killed
    from any thread. A grading that times out or crashes scores 0, says so in Verdict.failure
    (the caller counts it), and the next call starts a fresh worker. The worker is sent the
    answer region and the last number of the response's tail, found here in bounded time, so no
    length of response reaches sympy. `command` replaces the worker, for tests.
    """

    STARTUP_S = 120.0  # importing sympy can take a while on a loaded machine; not charged to answers

    def __init__(self, timeout: float = 10.0, command: list[str] | None = None):
        self.timeout = timeout
        self.command = command or [sys.executable, str(Path(__file__).resolve()), "--math-worker"]
        self._proc, self._replies, self._lock = None, None, threading.Lock()

    def __call__(self, response: str, gold: str, deadline: float | None = None) -> Verdict:
        """The verdict on one response. A `deadline` (a time.monotonic() value) that comes first cuts
        the wait short: a worker still grading is killed, and the answer scores failure "budget"."""
        if deadline is not None and time.monotonic() >= deadline:
            return Verdict(0.0, failure="budget")
        try:
            request = _math_request(response, gold)
        except AnswerTooLong:
            return Verdict(0.0)
        with self._lock:  # one request in flight per worker: replies are matched by order
            try:
                if self._proc is None:
                    self._start(deadline)
                self._proc.stdin.write(json.dumps(request) + "\n")  # ASCII: json escapes lone surrogates
                self._proc.stdin.flush()
                reply = self._reply(self.timeout, deadline, "timeout")
            except _NoReply as e:
                failure = e.failure
            except OSError:  # the worker could not be run, or died before reading the request
                failure = "error"
            else:
                return Verdict(float(reply["reward"]), reply["answer"], reply["failure"])
            self.close()
            return Verdict(0.0, failure=failure)

    def start(self) -> None:
        """Start the worker unless it runs; one that fails to start is reported by the next call."""
        with self._lock:
            if self._proc is None:
                try:
                    self._start(None)
                except (_NoReply, OSError):
                    self.close()

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
        if self._reply(self.STARTUP_S, deadline, "error") != "ready":
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


class MathGraderPool:
    """Several MathGraders driven from threads, so that a slow answer holds up one worker of a
    batch, not the batch."""

    def __init__(self, timeout: float = 10.0, workers: int = 4, command: list[str] | None = None):
        self.graders = [MathGrader(timeout, command) for _ in range(workers)]

    def __call__(self, response: str, gold: str) -> Verdict:
        """One answer, on the first worker: a single grading does not start the others."""
        return self.graders[0](response, gold)

    def grade_all(self, pairs: list[tuple[str, str]], budget: float = 0.0) -> list[Verdict]:
        """One Verdict per (response, gold), in order. A budget (seconds; 0: none) bounds the batch:
        what is not graded once it is spent scores failure "budget", a worker still busy is killed.
        Its clock starts once the workers run: a worker's first start is no answer's fault."""
        self.start()
        deadline = time.monotonic() + budget if budget > 0 else None
        idle: queue.SimpleQueue = queue.SimpleQueue()
        for grader in self.graders:
            idle.put(grader)

        def grade(pair: tuple[str, str]) -> Verdict:
            grader = idle.get()  # never waits: there are as many threads as graders
            try:
                return grader(*pair, deadline=deadline)
            finally:
                idle.put(grader)

        with ThreadPoolExecutor(len(self.graders)) as threads:
            return list(threads.map(grade, pairs))

    def start(self) -> None:
        """Start the stopped workers at once: each spends seconds importing math_verify."""
        with ThreadPoolExecutor(len(self.graders)) as threads:
            list(threads.map(MathGrader.start, self.graders))

    def close(self) -> None:
        for grader in self.graders:
            grader.close()


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

    # str(int) refuses more than 4,300 digits (sys.int_info), so no gold sum is longer; twice that
    # leaves room for spaces around it
    ANSWER_CHARS = 8192

    @grades_safely
    def grade(self, problem: Problem, response: str) -> Verdict:
        pred = extract_tag(answer_window(response, self.ANSWER_CHARS))
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


# ----------------------------------------------------------------------------- countdown

COUNTDOWN_PROMPT = (
    "Using the numbers {nums}, create an equation that equals {target}. You can use basic "
    "arithmetic operations (+, -, *, /) and each number can only be used once. Show your work "
    "in <think> </think> tags. And return the final answer in <answer> </answer> tags, for "
    "example <answer> (1 + 2) / 3 </answer>.")


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

    # a correct equation of four numbers below 100 is some 20 characters; 1,024 leaves room for
    # spaces and bounds the parser's work
    ANSWER_CHARS = 1024

    @grades_safely
    def grade(self, problem: Problem, response: str) -> Verdict:
        gold = json.loads(problem.answer)
        expr = extract_tag(answer_window(response, self.ANSWER_CHARS))
        if expr is None:
            return Verdict(0.0)
        try:
            value, used = parse_arithmetic(expr)
        except ExpressionError:
            return Verdict(0.0, expr)
        # maj@n votes on the expression: two different correct equations are different answers
        return Verdict(float(sorted(used) == sorted(gold["numbers"]) and value == gold["target"]),
                       expr.replace(" ", ""))


# ----------------------------------------------------------------------------- files

class FileTask:
    """Problems from a benchmark file (`load_file`), graded by math-verify in a pool of `workers`
    processes (`MathGraderPool`), `budget` seconds a batch (0: no limit; see `grade_batch`)."""

    name = "file"

    def __init__(self, path: str, grade_timeout: float = 10.0, workers: int = 4, budget: float = 0.0):
        if importlib.util.find_spec("math_verify") is None:  # say so now, not as a 0 reward per answer
            raise DataError(f"{path}: grading a benchmark file needs math-verify: pip install math-verify")
        self.path, self.budget = path, budget
        self.problems = load_file(path)
        self.grader = MathGraderPool(grade_timeout, workers)

    def grade(self, problem: Problem, response: str) -> Verdict:
        return self.grader(response, problem.answer)

    def grade_batch(self, items: list[tuple[Problem, str]], budget: float) -> list[Verdict]:
        return self.grader.grade_all([(response, problem.answer) for problem, response in items], budget)

    def close(self) -> None:
        """Kill the grading workers (they also die with this process)."""
        self.grader.close()


def load_file(path: str) -> list[Problem]:
    """Problems from .jsonl (one object per line), .json (a list of objects) or .parquet
    (needs pyarrow), by their usual field names: prompt/problem/question, then
    answer/ground_truth/solution. Every error names the file, the line (row) and the field."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{path}: no such file (give --data running_sum, countdown, or a "
                        f".jsonl/.json/.parquet path)")
    rows = _rows(p)
    problems = []
    for lineno, row in rows:
        if not isinstance(row, dict):
            raise DataError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
        problems.append(Problem(prompt=_field(row, PROMPT_FIELDS, path, lineno),
                                answer=gold_answer(_field(row, ANSWER_FIELDS, path, lineno))))
    if not problems:
        raise DataError(f"{path}: the dataset is empty (no rows)")
    return problems


def _rows(p: Path) -> list[tuple[int, object]]:
    """(line or row number from 1, record) pairs of a data file."""
    suffix = p.suffix.lower()
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise DataError(f"{p}: reading parquet needs pyarrow (pip install pyarrow), "
                            f"or convert the file to JSONL") from None
        return list(enumerate(pq.read_table(p).to_pylist(), 1))
    data = p.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise DataError(f"{p}:{line}: not valid UTF-8 (byte {data[e.start]:#04x} at offset {e.start}); "
                        f"save the file as UTF-8") from None
    if suffix == ".json":
        try:
            records = json.loads(text)
        except json.JSONDecodeError as e:
            if e.msg != "Extra data":  # "Extra data": JSON lines named .json, as HF datasets writes them
                raise DataError(f"{p}:{e.lineno}: not valid JSON ({e.msg})") from None
        else:
            if not isinstance(records, list):
                raise DataError(f"{p}: expected a JSON list of objects (or use .jsonl, one per line)")
            return list(enumerate(records, 1))
    rows = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append((lineno, json.loads(line)))
        except json.JSONDecodeError as e:
            raise DataError(f"{p}:{lineno}: not valid JSON ({e.msg}); each line must be "
                            f"one JSON object") from None
    return rows


def _field(row: dict, names: tuple[str, ...], path: str, lineno: int) -> str:
    for name in names:
        if row.get(name) is not None:  # parquet rows carry every column, None where a row has none
            value = row[name]
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value:  # not NaN
                value = str(value)
            if not isinstance(value, str) or not value.strip():
                raise DataError(f"{path}:{lineno}: field '{name}' must be a non-empty string")
            return value
    raise DataError(f"{path}:{lineno}: missing field: expected one of {', '.join(names)}; "
                    f"the line has {', '.join(sorted(row)) or 'no fields'}")


# ----------------------------------------------------------------------------- splits

def make_task(data: str, *, sum_min_terms: int = 3, sum_max_terms: int = 5, sum_digits: int = 2,
              grade_timeout: float = 10.0, grade_workers: int = 4, grade_budget: float = 0.0):
    if data == "running_sum":
        return RunningSumTask(sum_min_terms, sum_max_terms, sum_digits)
    if data == "countdown":
        return CountdownTask()
    if data.endswith((".jsonl", ".json", ".parquet")) or Path(data).exists():
        return FileTask(data, grade_timeout, grade_workers, grade_budget)
    raise DataError(f"--data {data!r}: not a built-in task ({', '.join(BUILTIN_TASKS)}) "
                    f"nor a .jsonl/.json/.parquet file")


def grade_batch(task, items: list[tuple[Problem, str]], budget: float = 0.0,
                answer_after: str = "") -> list[Verdict]:
    """One Verdict per (problem, response), in order. A task with grading workers (FileTask) grades
    them in parallel within `budget` seconds for the whole batch (0: the task's own budget); what
    the budget leaves ungraded scores 0 with failure "budget". The built-in graders take
    milliseconds on any response, so they grade in order.

    answer_after: the answer gate of the Delethink recipe (its official reward reads only what
    follows the first "</think>"): the grader sees the text after the gate's first occurrence,
    and a response without the gate scores 0 ungraded. "x=41 </think> so \\boxed{42}" -> "so
    \\boxed{42}"; "6 times 7 is 42. Wait, but" (a trace cut at the chunk cap) -> 0."""
    if answer_after:
        gated = [(p, r.split(answer_after, 1)[1]) if answer_after in r else None for p, r in items]
        verdicts = iter(grade_batch(task, [g for g in gated if g], budget))
        return [next(verdicts) if g else Verdict(0.0) for g in gated]
    if not hasattr(task, "grade_batch"):
        return [task.grade(problem, response) for problem, response in items]
    return task.grade_batch(items, budget or task.budget)


# The instruction each paper's official code wraps a problem in (`--prompt-template NAME`), read
# off its data preprocessing. The chat-format ones (nsr, dr_grpo) are the whole prompt: the
# official code writes the Qwen chat format by hand, so they need chat_template false.
BOXED = "Please reason step by step, and put your final answer within \\boxed{}."
PROMPT_TEMPLATES = {
    # ritzz-ai/PACS @ bbe1dc6, src/preprocess_dataset.py
    "pacs": "{problem} " + BOXED,
    # tinnerhrhe/ROVER @ b0fa587, the problems of Math/data/*.parquet and Math/eval/benchmarks
    "rover": "{problem} Let's think step by step and output the final answer within \\boxed{}.",
    # McGill-NLP/the-markovian-thinker @ 4478839, delethink_tracing_demo.py (its training YAML's
    # single-quoted '\n\n' reaches the model as a literal backslash-n; we use the demo's newlines)
    "delethink": "{problem}\n\n" + BOXED,
    # TianHongZXY/RLVR-Decomposed @ a5d4e7c, verl/utils/dataset/rl_dataset.py (prompt_template_type qwen)
    "nsr": "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n{problem}\n"
           + BOXED + "<|im_end|>\n<|im_start|>assistant\n",
    # sail-sg/understand-r1-zero @ dfca49d, train_zero_math.py (qwen_math)
    "dr_grpo": "<|im_start|>system\n" + BOXED + "<|im_end|>\n<|im_start|>user\n{problem}<|im_end|>\n"
               "<|im_start|>assistant\n",
    # BytedTsinghua-SIA/DAPO @ 33fe317, eval/aime-2024.parquet (DAPO-Math-17k is built the same way)
    "dapo": "Solve the following math problem step by step. The last line of your response should be of the "
            "form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{problem}\n\n"
            "Remember to put your answer on its own line after \"Answer:\".",
    # volcengine/verl @ b178a3c, examples/data_preprocess/gsm8k.py
    "gsm8k": "{problem} Let's think step by step and output the final answer after \"####\".",
}


def prompt_template(template: str) -> str:
    """A --prompt-template value -> the format: a name of PROMPT_TEMPLATES, or a string holding
    {problem} once (other braces are kept as written, so \\boxed{} needs no escaping)."""
    text = PROMPT_TEMPLATES.get(template, template)
    if text.count("{problem}") != 1:
        raise DataError(f"--prompt-template {template!r}: give one of {', '.join(PROMPT_TEMPLATES)} or a "
                        f"string containing {{problem}} exactly once")
    return text


def with_template(problems: list[Problem], template: str) -> list[Problem]:
    """Each problem's prompt put into the template: "{problem} Answer briefly." with "2+2?" -> "2+2? Answer briefly."."""
    if not template:
        return problems
    text = prompt_template(template)
    return [Problem(text.replace("{problem}", p.prompt), p.answer) for p in problems]


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


if __name__ == "__main__" and sys.argv[1:] == ["--math-worker"]:
    _math_worker()
