"""Code problems: grading model-written Python programs against tests, each run in the sandbox
(grading/sandbox.py), and `CodeTask`, the task of a file of code problems (`--data code.jsonl`; data.py
imports this module only for such a file, so a run without code never loads the sandbox).

A code problem's tests come in one of the two shapes public datasets use:

    stdin/stdout (APPS, TACO, DeepCoder):  {"inputs": ["1 2\\n", ...], "outputs": ["3\\n", ...]}
        each input is the program's stdin, and its stdout is compared with the output;
    function calls (APPS/TACO "fn_name"):  {"fn_name": "add", "inputs": [[1, 2], ...], "outputs": [3, ...]}
        each input is a list of arguments for the function (or for the method of that name of a
        LeetCode-style `class Solution`), and its return value is compared with the output.

The program is the body of the response's last closed ```python fence. reward = 1 if every test
passes, else 0; `fraction` is the share of tests passed (for the logs).

Comparison, following the graders these datasets were published with:
- stdout: LiveCodeBench's grade_stdio (LiveCodeBench/LiveCodeBench @ 8610ffb,
  lcb_runner/evaluation/testing_util.py; DeepCoder's rllm grades LiveCodeBench and Codeforces
  problems with a copy of it, rllm-org/rllm @ eedfda9, rllm/rewards/code_reward.py): strip the whole
  output, split it into lines, strip each line; the line counts must agree, and each line must be
  equal, or else equal as lists of Decimal tokens ("0.50" == "0.5"). The program must also exit 0.
- return values: APPS's run_test (hendrycks/apps @ b45c0ed, eval/testing_util.py): a returned tuple
  counts as a list (JSON has none), then equal to the expected value; APPS also accepts the first
  element of an expected list, because it wraps many returns in one; we accept that only for
  one-element lists, which is what the wrapping is.
Unlike those graders, a program runs as written, as a judge runs it: nothing is imported for it,
and a stdin program's `if __name__ == "__main__":` block runs.

Bounds: each run has the sandbox's time limit (a stdin problem runs its program once per test; the
first test that times out or floods its output ends the problem, the rest counting as failed). A
batch has a wall-clock budget; what it leaves ungraded scores failure "budget". A program that
times out, crashes or prints a gigabyte scores 0 with its `failure` said, and grading goes on:
nothing here raises for anything a response contains.

Rewards cannot be forged from inside: expected outputs never enter the sandbox, and a function's
return values come back as JSON lines that are compared here; a test answered by more than one line
(a program printing fake results beside the harness's) fails.
"""
from __future__ import annotations

import json
import re
import sys
import textwrap
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from rewards import DataError, Problem, Verdict
from grading.sandbox import Limits, Result, Sandbox, SandboxError, SandboxWarning, isolation_note
from grading.files import CODE_FIELDS, PROMPT_FIELDS, records, row_field, row_id
from tasks import Task

MAX_PROGRAM_CHARS = 100_000  # a longer program is no sane solution: scored 0 ("too_long") unrun
PYTHON_FENCES = {"python", "py", "python3"}  # the info strings that mark a Python block
_FENCE = re.compile(r"^[ \t]*```([^\n]*)", re.MULTILINE)  # no nested quantifiers: linear on any text
RESULT_PREFIX = "@@rlvr-result "  # marks the harness's lines in a function program's stdout

# The recipes of code RL (`--code-template NAME`): for each, the prompt of a stdin/stdout problem and
# of a function problem, with {problem} and, in the function form, {starter}: the row's starter_code
# (LeetCode's "class Solution: ..."), else a line naming the function. The recipes choose the form by
# the presence of starter code; here the tests choose it, which is the same on their data.
LCB_SYSTEM = ("You are an expert Python programmer. You will be given a question (problem specification) and will "
              "generate a correct Python program that matches the specification and passes all tests.")
LCB_STARTER = ("You will use the following starter code to write the solution to the problem and enclose your code "
               "within delimiters.")
LCB_STDIN = ("Read the inputs from stdin solve the problem and write the answer to stdout (do not directly test on "
             "the sample inputs). Enclose your code within delimiters as follows.")
LCB_ANSWER = "### Answer: (use the provided format with backticks)\n\n"
PRIME_CODE = ("{problem}\n\nWrite Python code to solve the problem. Present the code in \n```python\nYour code\n```\n"
              "at the end.")
CODE_TEMPLATES = {
    # rllm-org/rllm @ 2939f8c, rllm/data/utils.py fetch_live_code_bench_system_prompt with the constants of
    # rllm/system_prompts.py (DeepCoder's training prompt): LiveCodeBench's with its system message inline,
    # one more sentence for stdin, and the problem run straight into "### Format" (its problems end in a newline)
    "deepcoder": (LCB_SYSTEM + "\n\n{problem}### Format: " + LCB_STDIN + " Ensure that when the python program runs, "
                  "it reads the inputs, runs the algorithm and writes output to STDOUT.\n```python\n# YOUR CODE HERE\n"
                  "```\n\n" + LCB_ANSWER,
                  LCB_SYSTEM + "\n\n{problem}### Format: " + LCB_STARTER + "\n```python\n{starter}\n```\n\n"
                  + LCB_ANSWER),
    # LiveCodeBench/LiveCodeBench @ 0b6e5ff, lcb_runner/prompts/code_generation.py
    # get_generic_question_template_answer; LiveCodeBench sends LCB_SYSTEM (and "You will NOT return anything
    # except for the program.") as a system turn, which a run's one user message does not have
    "lcb": ("### Question:\n{problem}\n\n### Format: " + LCB_STDIN + "\n```python\n# YOUR CODE HERE\n```\n\n"
            + LCB_ANSWER,
            "### Question:\n{problem}\n\n### Format: " + LCB_STARTER + "\n```python\n{starter}\n```\n\n"
            + LCB_ANSWER),
    # PRIME-RL/PRIME, README "Usage" (Eurus-2's code prompt): one instruction for both forms
    "prime": (PRIME_CODE, PRIME_CODE),
}
_SLOT = re.compile(r"\{(problem|starter)\}")


def code_prompt(problem: str, fn_name: str, starter, template: str) -> str:
    """A code problem in the CODE_TEMPLATES recipe `template` ("" = as it is): the stdin form, or for
    a function problem (fn_name) the call form with the starter code. Both slots are filled in one
    pass, so a problem that contains "{starter}" stays as written."""
    if not template:
        return problem
    stdin_form, call_form = CODE_TEMPLATES[template]
    if not fn_name:
        return _SLOT.sub(lambda m: problem, stdin_form)
    starter = starter if isinstance(starter, str) and starter.strip() else f"# define {fn_name} here"
    return _SLOT.sub(lambda m: problem if m.group(1) == "problem" else starter, call_form)


# Runs in the sandbox as main.py beside the program (solution.py): reads the calls from stdin, imports
# the program, and prints one line per call: RESULT_PREFIX + [index, returned?, value or exception name].
HARNESS = f"""\
import importlib.util, io, json, os, sys
request = json.loads(sys.stdin.read())
sys.stdin = io.StringIO()  # the program reads nothing of the request
results, sys.stdout = sys.stdout, open(os.devnull, "w")  # the program's own prints go nowhere
spec = importlib.util.spec_from_file_location("solution", "solution.py")
solution = importlib.util.module_from_spec(spec)
spec.loader.exec_module(solution)
fn = getattr(solution, request["fn_name"], None)
if fn is None and isinstance(getattr(solution, "Solution", None), type):
    fn = getattr(solution.Solution(), request["fn_name"], None)
for index, args in enumerate(request["inputs"]):
    try:
        line = json.dumps([index, True, fn(*args)])
    except BaseException as e:  # a call that fails fails its test only
        line = json.dumps([index, False, type(e).__name__])
    results.write({RESULT_PREFIX!r} + line + "\\n")
    results.flush()
"""


class CodeTestsError(ValueError):
    """A problem's tests are malformed; the message names where and which field."""


@dataclass(frozen=True)
class CodeTests:
    inputs: list  # stdin texts; or, with fn_name, lists of arguments
    outputs: list  # expected stdout texts; or, with fn_name, expected return values
    fn_name: str = ""  # the function to call; "" for stdin/stdout tests


@dataclass
class CodeVerdict:
    """The grade of one response."""
    reward: float  # 1.0 if every test passed, else 0.0
    fraction: float  # the share of tests passed
    failure: str = ""  # why not every test was run to a clean end: "no_code", "too_long", "timeout",
    #                    "crash", "output_limit", "budget", "sandbox", "error"; "" when all were


def parse_tests(spec, where: str = "tests") -> CodeTests:
    """CodeTests from a dict, or its JSON text (APPS and TACO store `input_output` as text). `where`
    names the record in errors, e.g. "code.jsonl:3: input_output". Stdin inputs and outputs may be
    given as lists of lines, as in APPS: ["1 2", "3 4"] -> "1 2\\n3 4"."""
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except json.JSONDecodeError as e:
            raise CodeTestsError(f"{where}: not valid JSON ({e.msg})") from None
    if not isinstance(spec, dict):
        raise CodeTestsError(f"{where}: expected an object with 'inputs' and 'outputs', got {type(spec).__name__}")
    inputs, outputs, fn_name = spec.get("inputs"), spec.get("outputs"), spec.get("fn_name") or ""
    if not isinstance(inputs, list) or not isinstance(outputs, list) or not inputs:
        raise CodeTestsError(f"{where}: 'inputs' and 'outputs' must be non-empty lists")
    if len(inputs) != len(outputs):
        raise CodeTestsError(f"{where}: {len(inputs)} inputs but {len(outputs)} outputs")
    if not isinstance(fn_name, str):
        raise CodeTestsError(f"{where}: 'fn_name' must be a string, got {type(fn_name).__name__}")
    if fn_name:
        for i, args in enumerate(inputs):
            if not isinstance(args, list):
                raise CodeTestsError(f"{where}: inputs[{i}] must be the list of arguments to {fn_name}")
        return CodeTests(inputs, outputs, fn_name)
    return CodeTests([_text(x, f"{where}: inputs[{i}]") for i, x in enumerate(inputs)],
                 [_text(x, f"{where}: outputs[{i}]") for i, x in enumerate(outputs)])


def _text(value, where: str) -> str:
    if isinstance(value, list) and all(isinstance(line, str) for line in value):
        return "\n".join(value)
    if not isinstance(value, str):
        raise CodeTestsError(f"{where}: expected a string (or a list of lines), got {type(value).__name__}")
    return value


def extract_program(response: str) -> str | None:
    """The body of the last closed ```python (or ```py) fence, dedented; None if there is none.
    "```python\\nprint(1)\\n```\\ntext ```python\\nx" -> "print(1)\\n"; a body past
    MAX_PROGRAM_CHARS -> "" (no sane solution)."""
    found = python_block(response)
    if found is None:
        return None
    _, start, end = found
    return textwrap.dedent(response[start:end]) if end - start <= MAX_PROGRAM_CHARS else ""


def python_block(response: str) -> tuple[int, int, int] | None:
    """(where its opening fence starts, where its body starts, where it ends) of the last closed
    ```python (or ```py) fence; None if there is none."""
    blocks = python_blocks(response)
    return blocks[-1] if blocks else None


def python_blocks(response: str) -> list[tuple[int, int, int]]:
    """(where its opening fence starts, where its body starts, where it ends) of every closed
    ```python (or ```py) fence, in order (--env python's calls, environments/tools.py).

    Fences are CommonMark's: a line starting (after spaces) with ```; a fence closes a block when
    nothing but backticks and spaces follow it. One pass over the fence lines, linear in the length
    of any response. An unclosed block (a response cut at the length limit) is no program."""
    opened, block_start, is_python, blocks = 0, None, False, []
    for fence in _FENCE.finditer(response):
        info = fence.group(1).strip()
        if block_start is None:
            opened, block_start = fence.start(), fence.end() + 1
            is_python = info[:16].split(" ")[0].lower() in PYTHON_FENCES
        elif not info.strip("`"):
            if is_python:
                blocks.append((opened, block_start, fence.start()))
            block_start = None
    return blocks


def outputs_match(got: str, expected: str) -> bool:
    """LiveCodeBench's stdout rule (see the module docstring): "3 \\n0.50\\n\\n" matches "3\\n0.5"."""
    got_lines, want_lines = _lines(got), _lines(expected)
    return len(got_lines) == len(want_lines) and all(map(_same_line, got_lines, want_lines))


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.strip().split("\n")]


def _same_line(got: str, want: str) -> bool:
    """Equal, or equal as lists of Decimal tokens."""
    if got == want:
        return True
    try:
        return [Decimal(token) for token in got.split()] == [Decimal(token) for token in want.split()]
    except (InvalidOperation, ValueError):  # not numbers; or a signalling NaN, which refuses ==
        return False


def returns_match(value, expected) -> bool:
    """APPS's return-value rule (see the module docstring), on JSON values: [1, 2] matches [1, 2]
    (a returned (1, 2) arrives as [1, 2]) and [[1, 2]]; 1 matches 1 and [1]."""
    try:
        return value == expected or (isinstance(expected, list) and len(expected) == 1 and value == expected[0])
    except (InvalidOperation, RecursionError):  # a signalling NaN compared; values nested too deep
        return False


class CodeGrader:
    """Grades responses against CodeTests in the sandbox, `workers` programs at a time (threads, each
    driving one sandboxed process); a batch is bounded by a wall-clock budget."""

    def __init__(self, sandbox: Sandbox | None = None, workers: int = 4):
        self.sandbox = sandbox or Sandbox()
        self.workers = workers

    def grade_all(self, items: list[tuple[str, CodeTests]], budget: float = 0.0) -> list[CodeVerdict]:
        """One CodeVerdict per (response, tests), in order. A budget (seconds; 0: none) bounds the
        batch: runs still going when it is spent are killed, and what is left scores "budget"."""
        deadline = time.monotonic() + budget if budget > 0 else None
        with ThreadPoolExecutor(self.workers) as threads:
            return list(threads.map(lambda item: self.grade(*item, deadline=deadline), items))

    def grade(self, response: str, tests: CodeTests, deadline: float | None = None) -> CodeVerdict:
        """The verdict on one response; `deadline` (a time.monotonic() value) cuts it short."""
        try:
            program = extract_program(response)
            if not program:
                return CodeVerdict(0.0, 0.0, "no_code" if program is None else "too_long")
            run = self._calls if tests.fn_name else self._stdio
            passed, failure = run(program, tests, deadline)
            return CodeVerdict(float(passed == len(tests.inputs)), passed / len(tests.inputs), failure)
        except Exception:  # noqa: BLE001 - a grader bug on one response must not end the run
            return CodeVerdict(0.0, 0.0, "error")

    def _stdio(self, program: str, tests: CodeTests, deadline: float | None) -> tuple[int, str]:
        """(tests passed, failure): one run per test, stopping at the first timeout or flood."""
        passed, failure = 0, ""
        for stdin, expected in zip(tests.inputs, tests.outputs):
            result, why = self._run(program, stdin, {}, deadline)
            failure = failure or why
            if why in ("timeout", "output_limit", "budget", "sandbox"):
                break
            if not why and outputs_match(result.stdout.decode(errors="replace"), expected):
                passed += 1
        return passed, failure

    def _calls(self, program: str, tests: CodeTests, deadline: float | None) -> tuple[int, str]:
        """(tests passed, failure): one run of the harness for all calls; a call counts if exactly
        one result line answers it and its value matches."""
        request = json.dumps({"fn_name": tests.fn_name, "inputs": tests.inputs})
        result, failure = self._run(HARNESS, request, {"solution.py": program}, deadline)
        answers = _answers(result.stdout.decode(errors="replace"))
        passed = sum(len(answers.get(i, [])) == 1 and answers[i][0][0] is True and returns_match(answers[i][0][1], want)
                     for i, want in enumerate(tests.outputs))
        return passed, failure

    def _run(self, program: str, stdin: str, files: dict[str, str], deadline: float | None) -> tuple[Result, str]:
        """A sandbox run within what is left of the budget, and its failure ("" for a clean exit 0)."""
        limit = self.sandbox.limits.timeout
        left = limit if deadline is None else min(limit, deadline - time.monotonic())
        if left <= 0:
            return Result(None, b"", b"", "budget"), "budget"
        result = self.sandbox.run(program, stdin, files, timeout=left)
        if result.killed == "timeout" and left < limit:
            return result, "budget"
        if result.killed:
            return result, {"error": "sandbox"}.get(result.killed, result.killed)
        return result, "" if result.exit_code == 0 else "crash"


def _answers(stdout: str) -> dict[int, list[tuple[bool, object]]]:
    """The harness's result lines by call index: {0: [(True, 3)], 1: [(False, "ZeroDivisionError")]}."""
    answers: dict[int, list] = {}
    for line in stdout.split("\n"):
        if line.startswith(RESULT_PREFIX):
            try:
                index, returned, value = json.loads(line[len(RESULT_PREFIX):])
                answers.setdefault(index, []).append((returned, value))
            except (ValueError, TypeError, RecursionError):  # not three items; an unhashable index
                continue
    return answers


# ----------------------------------------------------------------------------- the task of a file of code problems

PROGRAM_FAILURES = ("timeout", "crash", "output_limit")  # how a program fails a test besides a wrong output
GRADER_FAILURES = ("budget", "sandbox", "error")  # a CodeVerdict failure that is no fault of the program


class CodeTask(Task):
    """Code problems from a data file: each row has a prompt and its tests, stdin/stdout pairs or
    function calls (grading.code.parse_tests), and an optional `starter_code`; the prompt is put into
    the `template` recipe (CODE_TEMPLATES; "" = as it is). A response scores 1 when the program of
    its last ```python block passes every test, run in the sandbox (`isolation`, `timeout` seconds
    and `memory` MiB per run) by `workers` threads, each batch within `budget` seconds. The share of
    tests passed and how programs failed are Verdict.details; a program's failure (timeout, crash,
    flood) is a wrong answer, only the grader's own (budget, sandbox error) counts as a grader failure.

    A problem's answer names its row ("path:line") and the tests stay here, so that samples, logs
    and the episodes gathered over ranks never carry megabytes of test data."""

    name = "code"

    def __init__(self, path: str, *, template: str = "", isolation: str = "auto", timeout: float = 5.0,
                 memory: int = 1024, workers: int = 4, budget: float = 0.0):
        self.template, self.budget = template, budget
        self.tests: dict = {}  # Problem.answer -> its CodeTests
        self.problems = self.read(path)
        box, self.warnings = code_sandbox(isolation, Limits(timeout=timeout, memory=memory << 20))
        self.grader = CodeGrader(box, workers)

    def read(self, path: str) -> list[Problem]:
        """The problems of a file of code problems (this task's, or its --eval-data); their tests
        are kept here."""
        problems = []
        for lineno, row in records(path):
            field = next((name for name in CODE_FIELDS if row.get(name) is not None), None)
            if field is None:
                raise DataError(f"{path}:{lineno}: missing field: expected one of {', '.join(CODE_FIELDS)} "
                                f"(every row of a file of code problems has its tests)")
            try:
                tests = parse_tests(row[field], f"{path}:{lineno}: {field}")
            except CodeTestsError as e:
                raise DataError(str(e)) from None
            key = f"{path}:{lineno}"
            self.tests[key] = tests
            prompt = row_field(row, PROMPT_FIELDS, path, lineno)
            problems.append(Problem(code_prompt(prompt, tests.fn_name, row.get("starter_code"), self.template), key,
                                    id=row_id(row)))
        return problems

    def splits(self) -> tuple[list[Problem], list[Problem]]:
        return self.problems, []  # its held-out problems are another file's (--eval-data)

    def grade(self, problem: Problem, response: str) -> Verdict:
        return self.grade_batch([(problem, response)], 0.0)[0]

    def grade_batch(self, items: list[tuple[Problem, str]], budget: float) -> list[Verdict]:
        known = [problem.answer in self.tests for problem, _ in items]
        runs = iter(self.grader.grade_all([(response, self.tests[problem.answer])
                                           for (problem, response), ok in zip(items, known) if ok], budget))
        return [code_verdict(next(runs), response) if ok else Verdict(0.0, failure="error")
                for (_, response), ok in zip(items, known)]


def code_verdict(run: CodeVerdict, response: str) -> Verdict:
    """A CodeVerdict as the trainer's Verdict. maj@n votes on the program; details hold the share of
    tests passed and, 0 or 1 each, whether there was no program and how the program failed."""
    program = extract_program(response)
    details = {"code/tests_passed": run.fraction, "code/no_program": float(run.failure in ("no_code", "too_long")),
               **{f"code/{failure}": float(run.failure == failure) for failure in PROGRAM_FAILURES}}
    return Verdict(run.reward, program.strip() if program else None,
                   run.failure if run.failure in GRADER_FAILURES else "", details)


def code_sandbox(isolation: str, limits: Limits) -> tuple[Sandbox, tuple[str, ...]]:
    """The sandbox code problems run in, and its warning when it isolates less than bwrap (said
    once, by rank 0, rather than by every rank's warnings module). Programs need only the standard
    library, so where our interpreter cannot serve (as root without bwrap, the programs' uid cannot
    reach one under /root) the system's /usr/bin/python3 runs them."""
    first_error = ""
    for python in (sys.executable, "/usr/bin/python3"):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", SandboxWarning)
                box = Sandbox(isolation, python=python, limits=limits)
        except SandboxError as e:
            first_error = first_error or str(e)
            continue
        note = isolation_note(box.isolation, box.root, box.passed_over, box.uid_base)
        return box, (note,) if note else ()
    raise DataError(f"--sandbox {isolation}: {first_error}")
