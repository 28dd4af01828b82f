"""Your multi-turn environment, `--env path/to/file.py:Class`, run in worker processes with a time limit,
the way grading.pool.RewardFunction runs a --reward function: the file is never imported into the trainer.

The class you write:

    class Class:
        def __init__(self, problem):      # a rewards.Problem (prompt, answer, domain, id)
        def step(self, turn: str):        # the model's latest turn -> an object with the attributes
            observation                   #   str, or a list of 1 to MAX_MESSAGES str (one tool message
                                          #   each): what the model sees next; None: the trace is done
            reward                        #   None or a finite real number: with an observation, this turn's
                                          #   reward; when done, the trace's (None: the task grades it)
            details                       #   optional: a dict of str -> finite real number (metrics)
        tools = (fn, ...)                 # optional: functions, listed in the prompt by the chat template
                                          #   (environments/tools.py: a ToolEnvironment runs their calls)
        stop_strings = ("</call>",)       # optional: text that ends a turn (a plain-text call's end)
        plain, done_reason                # optional, as environments.Environment has them

It must be deterministic: its state after some turns must be a function of the problem and those turns
alone. A worker that is killed (a step past the timeout) loses every environment it held, and the next
worker rebuilds each one when its trace next steps, by replay: Class(problem), then step(t) for every
earlier turn t (the outputs ignored), then the step asked for.

The protocol. `UserEnvironment` drives `workers` GradingWorkers (grading/pool.py), each a child process
running this module with `--env-worker FILE CLASS` (grading.pool.module_command). A trace's key picks its
worker by a stable hash, so all of a trace's turns reach the worker that holds its environment. The
child says "ready" once the file is imported (or {"error": ...} if it would not import), then answers
JSON lines, one reply per request:

    request  {"describe": true}, once, by check()
    reply    {"stop_strings": [str], "tools": [the JSON schema of each of the class's tools],
              "plain": [str, str], "done_reason": "done" | "no_call"} or {"error": str}
    request  {"key": str, "problem": {Problem's fields}, "turns": [every model turn so far], "max_chars": n}
    reply    {"observation": str | [str] | None, "reward": float | None, "details": {str: float}}
             or {"failure": "error" | "invalid", "message": the exception's last line, or what broke the contract}

The child keeps, per key, the environment, the number of turns it has applied, and a digest of the
problem and those turns; when these do not match the request (a new trace, a restarted worker, an evicted
environment, a key reused for another trace) it rebuilds by replay. It cuts the observation to
max_chars characters, all its messages together (environments.fair_cut), so no megabytes cross the
pipe, and drops a key's environment once its trace is done, after a failure (its state is unknown),
or when it is the least recently used of more than MAX_ENVS. Your prints go to stderr (stdout carries
the replies), as do the last lines of your tracebacks.

The parent keeps a mirror of which environments its worker holds (the same rules, on the same requests),
so that a step that must first replay n turns is given n + 1 timeouts, not one: a worker killed while
holding many traces would otherwise cascade, every replay timing out and killing the next worker.
"""
from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import sys
import threading
import time
import traceback
import zlib
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from environments import MAX_MESSAGES, fair_cut, messages_of
from grading.pool import GradingWorker, import_plugin, module_command, plugin_syntax, protocol_stdout
from rewards import DataError, Problem, is_reward, plugin_spec

MAX_ENVS = 4096  # live environments a worker keeps; bounds its memory whatever the number of traces
MAX_MESSAGE = 300  # characters of a failure's message (an exception's last line) sent back


class _Held(OrderedDict):
    """key -> what is held for it, least recently used first; past MAX_ENVS the oldest goes. One class for
    the child (environments) and the parent's mirror of it, so that the two evict alike."""

    def put(self, key: str, value) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > MAX_ENVS:
            self.popitem(last=False)


def _digest(problem: dict, turns: list[str]) -> str:
    """What an environment was built from: its problem and the turns it has applied."""
    return hashlib.blake2b(json.dumps([problem, turns]).encode(), digest_size=16).hexdigest()


class UserEnvironment:
    """--env file.py:Class, run in `workers` processes (GradingWorker), `timeout` seconds a step (a step
    that must first replay n earlier turns gets n + 1 timeouts; building the environment counts in its
    first step's). The class's contract: the module docstring. Step traces from several threads to use
    several workers at once; the traces of one worker step one at a time."""

    def __init__(self, spec: str, timeout: float = 10.0, workers: int = 2, max_chars: int = 65536,
                 budget: float = 0.0):
        if workers < 1 or timeout <= 0 or max_chars < 0 or budget < 0:
            raise ValueError(f"UserEnvironment: workers {workers} (>= 1), timeout {timeout} (> 0), "
                             f"max_chars {max_chars} (>= 0), budget {budget} (>= 0)")
        self.spec, self.max_chars, self.timeout, self.budget = spec, max_chars, timeout, budget or timeout
        path, name = plugin_spec(spec) or (Path(spec), "")  # a bad spec fails check(), or each step as "error"
        command = module_command("environments.worker", "--env-worker", str(path), name)
        self.workers = [EnvWorker(command, timeout) for _ in range(workers)]
        self.deadline: float | None = None  # the current round's end (`round`); None: each step its timeout
        # what check() reads of the class: its stop_strings, its tools' schemas, its plain frame, its done reason
        self.stop_strings, self.tools, self.plain, self.done_reason = (), [], ("", ""), "done"
        self.messages: dict[str, str] = {}  # a trace's last failure, said in words (`failure`)

    def check(self) -> None:
        """Read the spec and the file's syntax (without running it), then start one worker, so that a
        file that does not import fails before any model loads. Every problem is a DataError naming the
        file."""
        path, name, tree = plugin_syntax("--env", self.spec, "Class")
        if not any(isinstance(n, ast.ClassDef) and n.name == name for n in tree.body):
            raise DataError(f"--env {self.spec}: {path} has no top-level class {name}")
        first = self.workers[0]
        if not first.start():
            raise DataError(f"--env {self.spec}: its worker did not start: "
                            f"{first.start_error or 'see the error above'}")
        reply, _ = first.ask({"describe": True}, limit=first.STARTUP_S)  # part of the start-up: it reads the tools
        if reply is None or "error" in reply:
            raise DataError(f"--env {self.spec}: {(reply or {}).get('error', 'its worker did not describe the class')}")
        self.stop_strings, self.tools = tuple(reply["stop_strings"]), reply["tools"]
        self.plain, self.done_reason = tuple(reply["plain"]), reply["done_reason"]

    def step(self, key: str, problem: Problem, turns: list[str]) -> tuple[dict | None, str]:
        """Ask the environment of trace `key` to answer its latest turn, turns[-1] (turns: every model
        turn of this trace so far, decoded; the same key must come with the same problem and the same
        earlier turns, or the environment is rebuilt by replay). ({"observation": str | None, "reward":
        float | None, "details": {str: float}}, "") or (None, failure), failure "timeout" (the worker was
        killed), "error" (the class raised, or the worker died or would not start) or "invalid" (a step
        that broke the contract). Never raises on anything the environment does; raises ValueError on an
        empty `turns`, the caller's bug."""
        if not turns:
            raise ValueError(f"UserEnvironment.step: trace {key!r} has no turn to answer")
        worker = self.workers[zlib.crc32(key.encode("utf-8", "surrogatepass")) % len(self.workers)]
        reply, failure = worker(key, problem, turns, self.max_chars, lambda: self.deadline)
        if failure:
            self.messages[key] = self.said(failure, reply)
            return None, failure
        if self.deadline is not None:  # progress: the round goes on for another budget
            self.deadline = time.monotonic() + self.budget
        return reply, ""

    @contextmanager
    def round(self):
        """One round of turns (every trace's latest turn, from several threads) under one budget: it
        ends once the environment has answered no step for `budget` seconds (default: one timeout),
        and a step still waiting then fails "budget" at once (a worker still stepping is killed).
        So a hanging environment costs about one timeout a round, whatever the number of traces,
        not one a trace, while a sound one (each answer moves the end on) is never cut, however
        many traces a worker steps in turn. The clock starts once the workers run (a worker's
        start is no step's fault)."""
        with ThreadPoolExecutor(len(self.workers)) as threads:
            list(threads.map(EnvWorker.start, self.workers))
        self.deadline = time.monotonic() + self.budget
        try:
            yield
        finally:
            self.deadline = None

    def said(self, failure: str, reply: dict | None) -> str:
        """A failure in words: the environment's own message (its exception's last line, or how its
        step broke the contract) where it sent one."""
        if reply and reply.get("message"):
            return reply["message"]
        return {"timeout": f"a step took longer than --env-timeout {self.timeout:g} s",
                "budget": f"no step of its round of turns was answered for {self.budget:g} s (--env-budget)",
                "error": "its worker process died or would not start"}.get(failure, failure)

    def close(self) -> None:
        """Stop the workers; a later step starts them again."""
        for worker in self.workers:
            worker.close()


class EnvWorker(GradingWorker):
    """One worker process of a UserEnvironment, with the parent's mirror of the environments it holds."""

    def __init__(self, command: list[str], timeout: float):
        super().__init__(command, timeout)
        self._held: _Held = _Held()  # key -> digest, as the child holds it
        self._held_by = None  # the worker process the mirror describes
        self._step_lock = threading.Lock()  # the mirror is read before a request and updated after it

    STARTUP_S = 30.0  # from start to "ready": importing the file; one that hangs fails the start-up check

    def __call__(self, key: str, problem: Problem, turns: list[str], max_chars: int,
                 deadline=lambda: None) -> tuple[dict | None, str]:
        """(reply, "") or (the failure reply or None, failure). deadline(): the round's end as it stands
        when this step's turn at the worker comes (each answer before it may have moved it on)."""
        fields = dataclasses.asdict(problem)
        with self._step_lock:
            if self._proc is None or self._proc is not self._held_by:  # a new worker holds nothing yet
                self._held.clear()
            held = self._held.get(key) == _digest(fields, turns[:-1])
            request = {"key": key, "problem": fields, "turns": turns, "max_chars": max_chars}
            reply, failure = self.ask(request, deadline(), limit=self.timeout * (1 if held else len(turns)))
            self._held_by = self._proc
            if reply is None or "failure" in reply or reply["observation"] is None:
                self._held.pop(key, None)  # the child dropped it (or died)
            else:
                self._held.put(key, _digest(fields, turns))
        if reply is None:
            return None, failure
        if "failure" in reply:
            return reply, reply["failure"]
        return reply, ""


# ----------------------------------------------------------------------------- the child

class _Invalid(Exception):
    """A step's result that breaks the contract; the message says how."""


def _number(value) -> float | None:
    """value as a float when it is a finite real number (rewards.is_reward: bool and numpy scalars too)."""
    return float(value) if is_reward(value) else None


def _checked(result, max_chars: int) -> dict:
    """A step's result as the reply, of plain types, the observation cut to max_chars (all its messages
    together, environments.fair_cut); raises _Invalid."""
    missing = object()
    observation = getattr(result, "observation", missing)
    reward = getattr(result, "reward", missing)
    details = getattr(result, "details", None)
    if observation is missing or reward is missing:
        raise _Invalid(f"step returned {type(result).__name__}, with no observation or reward attribute")
    messages = None if observation is None else messages_of(observation)
    if observation is not None and messages is None:
        raise _Invalid(f"observation is {type(observation).__name__}, not str, a list of 1 to {MAX_MESSAGES} str, "
                       "or None")
    number = None if reward is None else _number(reward)
    if reward is not None and number is None:
        raise _Invalid(f"reward {reward!r:.100} is not None or a finite real number")
    details = {} if details is None else details
    if not (isinstance(details, dict) and all(isinstance(k, str) for k in details)):
        raise _Invalid("details is not a dict of str -> finite real number")
    numbers = {str.__str__(k): _number(v) for k, v in details.items()}
    if None in numbers.values():
        raise _Invalid("details is not a dict of str -> finite real number")
    if messages is not None:
        messages = fair_cut(messages, max_chars)
    return {"observation": messages[0] if isinstance(observation, str) else messages,
            "reward": number, "details": numbers}


def _answer(envs: _Held, cls, request: dict, path: str) -> str:
    """The reply to one request, as a JSON line, rebuilding the key's environment by replay when it is not held."""
    key, fields, turns = request["key"], request["problem"], request["turns"]
    earlier = _digest(fields, turns[:-1])
    env = None
    try:
        held = envs.pop(key, None)
        if held is not None and held[1] == earlier:
            env = held[0]
        else:
            env = cls(Problem(**fields))
            for turn in turns[:-1]:
                env.step(turn)
        reply = _checked(env.step(turns[-1]), request["max_chars"])
    except _Invalid as e:
        print(f"env_worker: {path} trace {key!r:.200}: invalid step: {e}", file=sys.stderr, flush=True)
        return json.dumps({"failure": "invalid", "message": f"invalid step: {e}"[:MAX_MESSAGE]})
    except Exception as e:  # noqa: BLE001 - a bug in the environment fails its trace, not the worker
        last = traceback.format_exception_only(type(e), e)[-1].strip()
        print(f"env_worker: {path} trace {key!r:.200}: {last}", file=sys.stderr, flush=True)
        return json.dumps({"failure": "error", "message": last[:MAX_MESSAGE]})
    if reply["observation"] is not None:  # a done trace, or a failed one (its state unknown), is dropped
        envs.put(key, (env, _digest(fields, turns)))
    return json.dumps(reply)


def _env_worker(path: str, name: str) -> None:
    """The child side of UserEnvironment: requests in, replies out, one JSON line each."""
    replies = protocol_stdout()
    try:
        cls = getattr(import_plugin(path, "rlvr_env"), name, None)
        if not isinstance(cls, type) or not callable(getattr(cls, "step", None)):
            raise TypeError(f"{name} is not a class with a step method")
    except Exception as e:  # noqa: BLE001 - reported to the parent, which names the file
        print(json.dumps({"error": f"importing {path} failed: {type(e).__name__}: {e}"}), file=replies, flush=True)
        return
    print(json.dumps("ready"), file=replies, flush=True)
    envs = _Held()
    for line in sys.stdin:
        request = json.loads(line)
        reply = _described(cls) if request.get("describe") else _answer(envs, cls, request, path)
        print(reply, file=replies, flush=True)


def _described(cls) -> str:
    """What the trainer reads of the class before a rollout: its stop_strings (text that ends a turn
    where it first appears, a list or tuple of non-empty str), the JSON schemas of its `tools`
    (transformers.utils.get_json_schema of each function, here where the functions live), its `plain`
    frame and its `done_reason` (a tool environment's "no_call")."""
    strings = getattr(cls, "stop_strings", ())
    if not isinstance(strings, (list, tuple)) or not all(isinstance(s, str) and s for s in strings):
        return json.dumps({"error": f"stop_strings is {strings!r:.100}: give a tuple of non-empty strings"})
    plain, done_reason = getattr(cls, "plain", ("", "")), getattr(cls, "done_reason", "done")
    if not (isinstance(plain, (list, tuple)) and len(plain) == 2 and all(isinstance(s, str) for s in plain)):
        return json.dumps({"error": f"plain is {plain!r:.100}: give a pair of strings"})
    if done_reason not in ("done", "no_call"):
        return json.dumps({"error": f"done_reason is {done_reason!r:.100}: give 'done' or 'no_call'"})
    tools = getattr(cls, "tools", ())
    if not isinstance(tools, (list, tuple)) or not all(callable(fn) for fn in tools):
        return json.dumps({"error": f"tools is {tools!r:.100}: give a tuple of functions"})
    try:
        schemas = []
        if tools:  # transformers is imported for tools alone
            from environments.tools import schema_of
            schemas = [schema_of(fn) for fn in tools]
    except Exception as e:  # noqa: BLE001 - not a function, no type hints, no Args: in its docstring, ...
        return json.dumps({"error": f"tools: {type(e).__name__}: {e}"})
    return json.dumps({"stop_strings": [str.__str__(s) for s in strings], "tools": schemas,
                       "plain": [str.__str__(s) for s in plain], "done_reason": done_reason})


if __name__ == "__main__" and sys.argv[1:2] == ["--env-worker"]:
    _env_worker(*sys.argv[2:4])
