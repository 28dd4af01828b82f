"""The grading worker pool: graders that run in child processes, for answers that may take
unboundedly long to grade (sympy under math-verify on an adversarial answer; a --reward function).

A `GradingWorker` is one child process that grades one request at a time under a wall-clock
limit: past it the worker is killed, the answer scores 0 with failure "timeout", and the next
request gets a fresh worker. A `GraderPool` drives several workers from threads, so one slow
answer holds up one worker, not the batch; an optional budget (seconds) bounds the whole batch,
and what it leaves ungraded scores failure "budget". The pools: `MathGraderPool` (math-verify, a
data file's grader, whose answer rules are grading/math_answers.py's and pre-check grading/precheck.py's,
and whose workers run this module: `--math-worker CPU_SECONDS`, each answer within that much CPU time,
rule 4.2 of docs/math.md) and `RewardFunction` (--reward path/to/file.py:function, whose workers run
this module too: `--reward-worker file.py function row|batch`); `module_command` starts either.

Verdict, answer extraction, the built-in graders and grade_batch are in rewards.py.
"""
from __future__ import annotations

import ast
import importlib.util
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from grading.math_answers import AnswerTooLong, judge, math_request, without_thousands
from grading.precheck import arithmetic, precheck
from rewards import DataError, Problem, Verdict, is_reward, plugin_spec


# ----------------------------------------------------------------------------- grading workers

class _NoReply(Exception):
    """A grading worker gave no reply; `failure` says why: "timeout", "budget" or "error"."""

    def __init__(self, failure: str):
        super().__init__(failure)
        self.failure = failure


ROOT = str(Path(__file__).resolve().parent.parent)  # the repository: the folder that holds grading/


def module_command(module: str, *args: str) -> list[str]:
    """The command that runs a module of this repository as a script (its `__main__` block), in a
    fresh interpreter whose sys.path starts at the repository, as `python train.py` does, wherever
    the trainer was started from (`-c` would put the working directory there instead):
    module_command("grading.math_answers", "--math-worker")."""
    # alter_sys: the module is __main__ (sys.modules, sys.argv[0]) while it runs, as a script is
    boot = (f"import runpy, sys; sys.path[0] = {ROOT!r}; "
            f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)")
    return [sys.executable, "-c", boot, *args]


class GradingWorker:
    """A child process that grades one JSON request at a time under a wall-clock limit.

    Why a process: a grader can run unboundedly long on an adversarial answer (sympy does), and a
    time limit by SIGALRM works only on a process's main thread (not in a thread pool, a notebook
    executor, or a helper thread of a torchrun worker). A child process can be killed from any
    thread. A request that times out or crashes its worker scores 0 and says so in
    Verdict.failure (the caller counts it), and the next request starts a fresh worker. The worker
    says "ready" once it has started; its replies are Verdicts as JSON, one line each, and one may
    come after "warming" ... "warm": a part of its start that it did only when a request needed it,
    timed as the start is (STARTUP_S, not the request's limit; a budget's deadline still ends it).
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
                reply = self._reply(limit or self.timeout, deadline, "timeout")
                if reply == "warming":  # a part of its start deferred to this request: timed as a start
                    self._reply(self.STARTUP_S, deadline, "error")  # "warm"
                    reply = self._reply(limit or self.timeout, deadline, "timeout")
                return reply, ""
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
        # a session of its own: whatever the grader or an environment starts (children, grandchildren)
        # is in the worker's process group, and ends with it (close, end)
        proc = subprocess.Popen(self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                start_new_session=True)
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
        self._finalizer = weakref.finalize(self, end, proc)  # no orphan worker (or child of it) at exit
        try:
            said = self._reply(self.STARTUP_S, deadline, "error")
        except _NoReply as e:
            if e.failure == "error" and proc.poll() is None:  # alive and silent: the import hangs
                self.start_error = f"it did not say ready within {self.STARTUP_S:g} s (an import that hangs?)"
            raise
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
            self._finalizer()  # kills the worker and its process group (once), and forgets it at exit
            proc.wait()


def end(proc: subprocess.Popen) -> None:
    """Kill a worker and every process in its group (what it started, unless that left the group)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # the group is gone already
        proc.kill()


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


# ----------------------------------------------------------------------------- math-verify

GRADE_CPU = 4.0  # --grade-cpu's default: see _math_worker


class MathGrader(GradingWorker):
    """HF math-verify in a child process (a GradingWorker), one answer at a time. The worker is sent
    the answer region, the last boxes and the last number of the response's tail (math_request),
    found here in bounded time, so no length of response reaches sympy; an answer that the pre-check
    decides is never sent. `cpu`: the worker's CPU seconds per answer (--grade-cpu); `command`
    replaces the worker, for tests."""

    def __init__(self, timeout: float = 10.0, command: list[str] | None = None, cpu: float = GRADE_CPU):
        super().__init__(command or module_command("grading.pool", "--math-worker", str(cpu)), timeout)

    def __call__(self, response: str, gold: str, deadline: float | None = None) -> Verdict:
        """The verdict on one response; past the `deadline` it scores failure "budget"."""
        if deadline is not None and time.monotonic() >= deadline:
            return Verdict(0.0, failure="budget")
        try:
            request = math_request(response, gold)
        except AnswerTooLong:
            return Verdict(0.0)
        return precheck(request) or verdict(*self.ask(request, deadline))


class MathGraderPool(GraderPool):
    """`workers` MathGraders: a data file's grader when no --reward is given."""

    def __init__(self, timeout: float = 10.0, workers: int = 4, command: list[str] | None = None,
                 cpu: float = GRADE_CPU):
        super().__init__([MathGrader(timeout, command, cpu) for _ in range(workers)])

    def __call__(self, response: str, gold: str) -> Verdict:
        """One answer, on the first worker: a single grading does not start the others."""
        return self.graders[0](response, gold)

    def grade_one(self, problem: Problem, response: str) -> Verdict:
        return self(response, problem.answer)

    def grade_items(self, items: list[tuple[Problem, str]], budget: float = 0.0) -> list[Verdict]:
        return self.grade_all([(response, problem.answer) for problem, response in items], budget)


def _math_worker(cpu_seconds: float) -> None:
    """The child side of MathGrader: `math_request` JSON lines in, Verdict JSON lines out; each
    answer judged within `cpu_seconds` of CPU time (within_cpu), or scored 0 as a "timeout".

    Rule 4.2, the CPU bound: an answer whose comparison explodes under sympy (a power of a sum
    expanded, (x+1)^{1000}: 5 s; a power tower against an integral: 4 s; \\binom{10^9}{5 \\cdot 10^8}:
    unbounded) ends here, in the worker, instead of at the parent's --grade-timeout and a worker
    restart. CPU time, not wall time, so that a loaded machine does not change a verdict; a slower
    CPU can, so the default, GRADE_CPU, is 2x the slowest legitimate grading found on a warmed worker:
    a right answer to an unevaluated integral, 1.3-1.8 s (its series, 0.9-1.1 s; the suite's fixtures
    at most 0.3 s, math-verify's own test triples 0.6 s: docs/measured.md, issue 61). It is sized for a
    warmed worker: warm_up pays sympy's first-use imports, 0.2-0.5 s each, which would otherwise land
    on the first answer of each kind, so a change to the warm-up changes what the bound allows. The
    worker says ready after the first pair (a number: all that plain arithmetic pays, numbers() below)
    and grades the rest before the first answer that is not plain arithmetic, outside its CPU bound and,
    said between "warming" and "warm", outside its --grade-timeout, as a start is (GradingWorker.ask): a
    file of numbers never pays sympy's first factorisation, relation, sum and integral (1-2 s of CPU a
    worker, docs/measured.md, issue 69)."""
    import logging

    import math_verify
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeout disabled": the parent times us
    signal.signal(signal.SIGPROF, on_cpu_limit)
    warm_up(math_verify, WARM_UP[:1])
    print(json.dumps("ready"), flush=True)
    warmed = False  # the whole warm-up paid
    for line in sys.stdin:
        request = json.loads(line)
        if not (warmed or numbers(request)):
            print(json.dumps("warming"), flush=True)
            warm_up(math_verify)
            print(json.dumps("warm"), flush=True)
            warmed = True
        try:
            judged = within_cpu(cpu_seconds, judge, math_verify, request)
            reply = {"reward": judged.reward, "answer": judged.answer, "failure": ""}
        except OverCPU:
            reply = {"reward": 0.0, "answer": None, "failure": "timeout"}
        except Exception:  # noqa: BLE001 - any grader crash scores 0 and is counted, never kills the run
            reply = {"reward": 0.0, "answer": None, "failure": "error"}
        print(json.dumps(reply), flush=True)


# (gold, response): sympy imports modules on first use, 0.2-0.5 s each, for the first grading,
# simplification, relation, sum and integral
WARM_UP = (("1", "\\boxed{1}"), ("x^2-1", "\\boxed{(x-1)(x+1)}"), ("1 \\le x \\le 2", "\\boxed{x \\in [1, 2]}"),
           ("F_n = \\sum_{k=0}^{n-1} a_k", "\\boxed{F_n = \\sum_{k=0}^{n-2} a_k}"),
           ("\\int_{0}^{1} x \\, dx", "\\boxed{\\frac{1}{2}}"))


def warm_up(mv, pairs: tuple = WARM_UP) -> None:
    """Grade what pays sympy's first-use costs, no answer's fault nor its CPU time (_math_worker says
    how the CPU bound depends on it, and when a worker grades which pairs)."""
    for gold, response in pairs:
        judge(mv, math_request(response, gold))


def numbers(request: dict) -> bool:
    """Whether a math_request is plain arithmetic on both sides (precheck.arithmetic reads the gold and
    the final answer) and math-verify reads the answer alone (its box, or its line): what a worker grades
    with the first warm-up pair alone, whose first-use costs are a number's (the suite's 41 such pairs took
    0.08 s at most on a worker warmed by it alone, 0.04 s on a warmed one: docs/measured.md, issue 69).
    "\\boxed{42}" against 42 -> True; "The answer is 54, not 53." -> False."""
    answer, gold = request["answer"], request["gold"]
    return (answer is not None and request["region"] in (answer, f"\\boxed{{{answer}}}")
            and arithmetic(answer) is not None and arithmetic(without_thousands(gold)) is not None)


class OverCPU(BaseException):
    """A grading passed its CPU time. A BaseException, as math-verify's own TimeoutException is, so
    that no `except Exception` in sympy or the library swallows it."""


_cpu_limited = False  # whether a SIGPROF now ends the grading (within_cpu arms it)


def on_cpu_limit(signum, frame) -> None:
    """The SIGPROF handler within_cpu relies on: a process routes SIGPROF here once, on its main thread."""
    if _cpu_limited:
        raise OverCPU


def within_cpu(seconds: float, fn, *args, **kwargs):
    """fn(*args, **kwargs), raising OverCPU once this process has spent `seconds` of CPU time on
    it (SIGPROF, which the caller routes to on_cpu_limit; math-verify's own timeout interrupts sympy
    the same way, by a signal, on wall time). The signal repeats every 0.05 s until fn ends, in case
    a bare `except:` in sympy swallows one; when fn ends the flag goes down first, so that a signal
    still pending then does nothing."""
    global _cpu_limited
    _cpu_limited = True
    signal.setitimer(signal.ITIMER_PROF, seconds, 0.05)
    try:
        return fn(*args, **kwargs)
    finally:
        _cpu_limited = False
        signal.setitimer(signal.ITIMER_PROF, 0)


# ----------------------------------------------------------------------------- --reward file.py:function

class RewardFunction(GraderPool):
    """Your reward function, `--reward path/to/file.py:function`, run like math-verify: in `workers`
    processes (GradingWorker), `timeout` seconds a response. The file is never imported into the
    trainer: its code runs only in the workers, whose stdout carries the replies (your prints go to
    stderr). A parameter list (prompt, response, answer) is called per response; (prompts,
    responses, answers) once per batch, in one worker, within timeout × the batch's size. `flag`: the one
    its errors name, --reward or --reward-terms."""

    def __init__(self, spec: str, timeout: float = 10.0, workers: int = 4, flag: str = "--reward"):
        path, name, self.batch = reward_signature(spec, flag)
        command = module_command("grading.pool", "--reward-worker", str(path), name, "batch" if self.batch else "row")
        super().__init__([RewardWorker(command, timeout) for _ in range(1 if self.batch else workers)])
        self.spec, self.flag = spec, flag
        self.check()

    def check(self) -> None:
        """Start one worker now, so that a file that does not import fails before any model loads."""
        first = self.graders[0]
        if not first.start():
            raise DataError(f"{self.flag} {self.spec}: its worker did not start: "
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


def plugin_syntax(flag: str, spec: str, kind: str) -> tuple[Path, str, ast.Module]:
    """(file, name, the file's syntax tree) of a `flag path/to/file.py:name` value, read without
    running it (--reward's function, --env's class). Every problem is a DataError naming the file."""
    found = plugin_spec(spec)
    if found is None:
        raise DataError(f"{flag} {spec!r}: give path/to/file.py:{kind}")
    path, name = found
    if not path.is_file():
        raise DataError(f"{flag} {spec}: no such file {path}")
    try:
        return path, name, ast.parse(path.read_text(), filename=str(path))
    except (SyntaxError, UnicodeDecodeError) as e:
        raise DataError(f"{flag} {spec}: {path} is not valid Python ({e})") from None


def reward_signature(spec: str, flag: str = "--reward") -> tuple[Path, str, bool]:
    """(file, function name, batch form?) of a --reward value (or a --reward-terms term's: `flag`), read from
    the file's syntax without running it: a top-level def with the parameters (prompt, response, answer) or
    (prompts, responses, answers). Every problem is a DataError naming the flag and the file."""
    path, name, tree = plugin_syntax(flag, spec, "function")
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    if not defs:
        raise DataError(f"{flag} {spec}: {path} has no top-level function {name}")
    params = [a.arg for a in defs[-1].args.posonlyargs + defs[-1].args.args]
    if params not in (list(REWARD_PARAMS), list(BATCH_PARAMS)):
        raise DataError(f"{flag} {spec}: {name}({', '.join(params)}) must take ({', '.join(REWARD_PARAMS)}) "
                        f"or, for a whole batch at once, ({', '.join(BATCH_PARAMS)})")
    return path, name, params == list(BATCH_PARAMS)


REWARD_PARAMS = ("prompt", "response", "answer")
BATCH_PARAMS = ("prompts", "responses", "answers")


def _reward_worker(path: str, name: str, form: str) -> None:
    """The child side of RewardFunction: {"rows": [[prompt, response, answer], ...]} JSON lines in,
    a Verdict (form "row": one row a call) or {"verdicts": [...]} (form "batch") out."""
    replies = protocol_stdout()
    try:
        function = getattr(import_plugin(path, "rlvr_reward"), name)
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


def protocol_stdout():
    """A worker child's reply channel: the real stdout, kept; everything the plug-in prints (print,
    a C library writing to fd 1) goes to stderr, so that it cannot break the protocol."""
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return replies


def import_plugin(path: str, module_name: str):
    """The module of a plug-in file, registered under module_name: dataclasses (a Step or a Verdict of
    your own, with `from __future__ import annotations`) look their classes up by module."""
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _scores(call, n: int) -> list[dict]:
    """The n Verdicts (as dicts) of what call() returns: a list of n rewards, each a number or
    (number, answer) for maj@n to vote on; an exception or a list of another length fails every
    row, anything else its own row. [0.5, (1, "42"), "1"] -> rewards 0.5, 1.0 (answer "42"), 0 (failure
    "error: returned '1'"). A failure says why after "error: " (the exception, or the value returned), so that
    the trainer can say it (grading/terms.py)."""
    try:
        values, why = list(call()), ""
    except Exception as e:  # noqa: BLE001 - a reward bug on one batch must not kill training
        values, why = None, f"error: {type(e).__name__}: {e}"
    if values is not None and len(values) != n:
        values, why = None, f"error: returned {len(values)} value(s) for {n} response(s)"
    out = []
    for v in values or [None] * n:
        reward, answer = v if isinstance(v, tuple) and len(v) == 2 else (v, None)
        ok = is_reward(reward) and (answer is None or isinstance(answer, str))
        out.append({"reward": float(reward) if ok else 0.0, "answer": answer if ok else None,
                    "failure": "" if ok else (why or f"error: returned {v!r}")[:300]})
    return out


if __name__ == "__main__" and sys.argv[1:2] == ["--reward-worker"]:
    _reward_worker(*sys.argv[2:5])
if __name__ == "__main__" and sys.argv[1:2] == ["--math-worker"]:
    _math_worker(float(sys.argv[2]))
