"""Multi-turn rollouts: the environment seam, and two built-in tools (`--env`).

A trace is the model's turns interleaved with observations:

    prompt (the task's) -> turn 1 -> observation 1 -> turn 2 -> ... -> turn k (done)

After each turn that ends with a stop id, the trace's environment reads the turn (decoded text) and
answers with a `Step`: an observation to append (a tool's output) and the model writes the next
turn, or `observation=None`: the trace is done, with the environment's reward or, when it gives
none, the task's grade of the last turn. The observation is rendered as a "tool" message of the
model's chat template when the template has one (Qwen2.5's, Llama 3's, the tiny model's), else
appended as plain text; its tokens are context for the next turn and never trained
(environments/rollout.py: every turn is a training row whose prompt holds all that came before, docs/math.md §8).

    --env calculator          a turn holding <calc>EXPR</calc> gets EXPR's exact value back
    --env python              a turn holding a ```python block gets the program's stdout back
    --env path/file.py:Class  your own: Class(problem) with step(turn) -> Step, run in worker
                              processes (environments/worker.py), bounded like a --reward function

Why this interface: it is tinker-cookbook's `Env` (an initial observation, then `step(action)` ->
reward, done, next observation) without the first call, because the task already makes each
problem's first prompt (its template, the chat template), so an environment only has to answer
turns; and it takes and returns text, because tools read text, while the token bookkeeping (the
chat template, the caps, the mask) stays in one place, here and in environments/rollout.py. One environment
object per trace, so a tool may keep state across the turns of its trace.

Bounds: a turn cap (--max-turns), an observation cap in tokens (--max-observation-tokens), and a
context cap per trace (--max-trace-tokens). An environment that raises, hangs (--env-timeout, for
a user's class), answers with something else than a Step of text, or returns megabytes ends its
trace with reward 0, counted in env/failures; the run goes on. Logged per trace, averaged:
turns/mean, tools/calls, tools/errors, tools/correct (calls whose value equals the gold answer),
length/observation (observation tokens), env/failures.
"""
from __future__ import annotations

import contextlib
import itertools
import json
import re
import textwrap
import threading
import warnings
from dataclasses import dataclass, field

from rewards import DataError, ExpressionError, Problem, is_reward, parse_arithmetic, plugin_spec


@dataclass
class Step:
    """An environment's answer to one turn."""
    observation: str | None = None  # text the model reads next (a tool's output); None: the trace is done
    reward: float | None = None  # when done: the trace's reward (None: the task grades the last turn); with an
    # observation: this turn's reward, which --turn-credit turns into advantages (docs/math.md §8)
    details: dict = field(default_factory=dict)  # numbers to log, summed over the trace's turns


class Environment:
    """The world of one trace, built with its problem. The default answers every turn with "done":
    a single-turn rollout, graded by the task."""

    plain = ("", "")  # the text around an observation where the chat template has no tool role
    stop_strings: tuple = ()  # text that ends a turn where it first appears, kept (a plain-text call's end)

    def __init__(self, problem: Problem):
        self.problem = problem

    def step(self, turn: str) -> Step:
        """The model's latest turn (decoded, special tokens dropped) -> what happens next."""
        return Step()


class ToolEnvironment(Environment):
    """A turn that calls the tool gets the tool's output back; a turn without a call ends the trace
    (the task grades it). A call is written either as the chat template writes tool calls (Qwen2.5,
    Qwen3, Hermes: <tool_call>{"name": NAME, "arguments": {ARGUMENT: ...}}</tool_call>, the tool
    listed in the prompt by `apply_chat_template(tools=[schema])`) or in the tool's plain form
    (`plain_call`); the last call of a turn is run. Subclasses give the tool's name, argument,
    description, plain form and `run`."""

    name = argument = description = ""
    MAX_CALL_CHARS = 16384  # a <tool_call> body longer than this is not read as JSON

    @classmethod
    def schema(cls) -> dict:
        """The tool as HF chat templates list it (a JSON schema, `apply_chat_template(tools=[...])`)."""
        return {"type": "function", "function": {
            "name": cls.name, "description": cls.description,
            "parameters": {"type": "object", "properties": {cls.argument: {"type": "string"}}, "required": [cls.argument]}}}

    def plain_call(self, turn: str) -> tuple[int, str] | None:
        """(where it starts, its argument) of the turn's last call in the tool's plain form."""
        raise NotImplementedError

    def call(self, turn: str) -> tuple[str | None, int]:
        """(the argument of the turn's last call, in either form, or None without one; how many
        <tool_call> bodies could not be read as a call of this tool)."""
        plain = self.plain_call(turn)
        calls, unread = [plain] if plain else [], 0
        for m in TOOL_CALL.finditer(turn):
            body = m.group(1) if len(m.group(1)) <= self.MAX_CALL_CHARS else ""
            try:
                call = json.loads(body)
            except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
                call = None
            args = call.get("arguments") if isinstance(call, dict) and call.get("name") == self.name else None
            if isinstance(args, dict) and isinstance(args.get(self.argument), str):
                calls.append((m.start(), args[self.argument]))
            else:
                unread += 1
        return (max(calls)[1] if calls else None), unread

    def run(self, code: str) -> tuple[str, bool]:
        """(output, whether the tool failed)."""
        raise NotImplementedError

    def step(self, turn: str) -> Step:
        code, unread = self.call(turn)
        if code is None:
            return Step(details={"tools/parse_errors": unread})
        output, failed = self.run(code)
        correct = not failed and output.strip() == self.problem.answer.strip()
        return Step(output, details={"tools/calls": 1, "tools/errors": int(failed), "tools/correct": int(correct),
                                     "tools/parse_errors": unread})


TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)


class Calculator(ToolEnvironment):
    """<calc>EXPR</calc>: + - * / ( ) over integers, exact (rewards.parse_arithmetic: a bounded
    parser, never Python's eval). "<calc>4821+9377</calc>" -> "14198"; "<calc>1/3+1/6</calc>" -> "1/2";
    "<calc>1/0</calc>" -> "error: division by zero"."""

    name, argument = "calculator", "expression"
    description = "Exact arithmetic: + - * / and parentheses over integers; the value, an integer or a fraction."
    MAX_CHARS = 200  # longer expressions are refused before parsing
    plain = ("<result>", "</result>")
    stop_strings = ("</calc>",)

    def plain_call(self, turn: str) -> tuple[int, str] | None:
        calls = [(m.start(), m.group(1)) for m in re.finditer(r"<calc>(.*?)</calc>", turn, re.S)]
        return calls[-1] if calls else None

    def run(self, code: str) -> tuple[str, bool]:
        if len(code) > self.MAX_CHARS:
            return f"error: longer than {self.MAX_CHARS} characters", True
        try:
            value, _ = parse_arithmetic(code)
        except ExpressionError as e:
            return f"error: {e}", True
        return str(value), False  # Fraction's str: "14198", "1/2"


class PythonTool(ToolEnvironment):
    """A ```python block: the program runs in the sandbox (grading/sandbox.py: its own process, limits,
    namespaces where the machine has them) and its stdout comes back, with its stderr's last line
    when it fails (the model may fix its code); a program the sandbox has to kill (time, output)
    ends the trace with reward 0. The last block of a turn is run, as a fresh program: no state is kept between
    the calls of a trace (a long-lived interpreter per trace would be a process per trace outliving
    its turns; a model that needs earlier values writes them again, as in the ToRL recipe's
    one-shot runs)."""

    name, argument = "python", "code"
    description = "Runs a Python program (standard library only) and returns what it prints."
    box = None  # the Sandbox programs run in, one per process: environment_for makes it (--sandbox, ...)
    making = threading.Lock()

    @classmethod
    def prepare(cls, isolation: str = "auto", timeout: float = 5.0, memory_mib: int = 1024) -> tuple[str, ...]:
        """Make the sandbox (grading.code.code_sandbox: a DataError when `isolation` cannot work here);
        its warnings when it isolates less than bubblewrap."""
        from grading.code import code_sandbox
        from grading.sandbox import Limits
        cls.box, notes = code_sandbox(isolation, Limits(timeout=timeout, memory=memory_mib << 20, stdout=64 << 10))
        return notes
    plain = ("```output\n", "\n```\n")  # Qwen2.5-Math's tool-integrated format
    stop_strings = ("```output",)  # where Qwen2.5-Math's and ToRL's turns end, the output's fence kept

    def plain_call(self, turn: str) -> tuple[int, str] | None:
        """The last closed ```python block, read as code problems read a response's program."""
        from grading.code import python_block
        found = python_block(turn)
        return None if found is None else (found[0], textwrap.dedent(turn[found[1]:found[2]]))

    def run(self, code: str) -> tuple[str, bool]:
        with PythonTool.making:  # traces answer from threads (environments/rollout.py's answers); one sandbox for all
            if PythonTool.box is None:  # a PythonTool made outside environment_for (tests, your code)
                PythonTool.prepare()
        result = PythonTool.box.run(code)
        if result.killed:  # past the time or output limit, or never started: the trace ends, scored 0
            raise EnvironmentFailed(f"the sandbox ended the program: {result.killed}")
        out = result.stdout.decode(errors="replace")
        if result.ok:
            return out, False
        return (out + (result.stderr.decode(errors="replace").strip().splitlines() or ["error"])[-1]).strip(), True


# ----------------------------------------------------------------------------- a user's environment

class WorkerEnvironment(Environment):
    """One trace of a `--env file.py:Class`: its turns go to environments.worker.UserEnvironment, which runs
    the class in a worker process, bounded; a failure there is a failed Step (Session counts it)."""

    keys = itertools.count()  # a trace's key in the worker pool, unique in this process

    def __init__(self, problem: Problem, pool):
        super().__init__(problem)
        self.pool, self.key, self.turns = pool, f"trace-{next(WorkerEnvironment.keys)}", []

    def step(self, turn: str) -> Step:
        self.turns.append(turn)
        reply, failure = self.pool.step(self.key, self.problem, self.turns)
        if reply is None:
            raise EnvironmentFailed(self.pool.messages.pop(self.key, failure))
        return Step(reply["observation"], reply["reward"], reply["details"])


class EnvironmentFailed(Exception):
    """An environment's step failed: raised, timed out, or answered with something else than a Step."""


# ----------------------------------------------------------------------------- the rollout's side

@dataclass
class Turns:
    """How far a multi-turn trace may go (environments/rollout.py's interact)."""
    max_turns: int = 4  # model turns per trace at most
    max_observation_tokens: int = 256  # tokens of one observation's text (the template's framing comes on top)
    max_tokens: int = 0  # a trace's context at most: query + turns + observations + the next turn's budget; 0 = no cap


# why a trace ended: the environment said done (or failed), the tool environment found no call in the
# turn, the turn cap, the context cap (--max-trace-tokens or the model's), a turn cut at max_new_tokens
STOPS = ("done", "failed", "no_call", "max_turns", "context", "length")
# what the rollout counts; an environment's details may not
OWN = {"env/failures", "length/observation", "turns/mean", *(f"stop/{s}" for s in STOPS)}


class Session:
    """One trace's environment as the rollout drives it: each turn's text in, the observation's
    token ids out (None: done), every failure caught and counted. details: the trace's numbers."""

    MAX_CHARS_PER_TOKEN = 16  # an observation is cut to this many characters per allowed token before tokenising

    def __init__(self, env: Environment, render: "Observations", cap: int):
        self.env, self.render, self.cap = env, render, cap
        self.reward: float | None = None  # the environment's reward for the trace, if it gave one
        self.turn_rewards: list[float] = []  # of each turn answered with an observation: the Step's reward, or 0
        self.cut = False  # the rollout's caps stopped the trace while the environment still answered
        self.stop = ""  # why the trace ended: one of STOPS (environments/rollout.py's interact sets it)
        self.error = ""  # what failed, in words, when the environment failed
        self.pending: dict = {}  # the numbers of the last observation, until it reaches the model
        self.details = {"tools/calls": 0, "tools/errors": 0, "tools/correct": 0, "tools/parse_errors": 0,
                        "length/observation": 0, "env/failures": 0}

    def answer(self, turn: str) -> list[int] | None:
        """The observation's ids, or None: the trace is done (with the environment's reward, or 0 and
        a failure counted). An observation's numbers count once it reaches the model (`seen`)."""
        try:
            step = self.env.step(turn)
            if not isinstance(step, Step):
                raise EnvironmentFailed(f"step returned {type(step).__name__}, not a Step")
            if step.observation is not None and not isinstance(step.observation, str):
                raise EnvironmentFailed(f"observation is {type(step.observation).__name__}, not text")
            if step.reward is not None and not is_reward(step.reward):
                raise EnvironmentFailed(f"reward {step.reward!r} is not a number")
            numbers = {name: float(value) for name, value in step.details.items()}
            if set(numbers) & OWN:
                raise EnvironmentFailed(f"details may not set {', '.join(sorted(set(numbers) & OWN))}")
            ids = None if step.observation is None else \
                self.render(step.observation[:self.cap * self.MAX_CHARS_PER_TOKEN], self.cap, self.env.plain, turn)
        except Exception as e:  # noqa: BLE001 - an environment's bug (or text no tokenizer takes) ends its trace, never the run
            self.reward, self.details["env/failures"], self.stop = 0.0, 1, "failed"
            self.error = f"{type(e).__name__}: {e}" if not isinstance(e, EnvironmentFailed) else str(e)
            return None
        if ids is None:
            self.reward = None if step.reward is None else float(step.reward)
            self.count(numbers)
            self.stop = "no_call" if isinstance(self.env, ToolEnvironment) else "done"
            return None
        self.pending = {**numbers, "length/observation": len(ids)}
        # the turn earned it, whether or not the caps let the model read the observation
        self.turn_rewards.append(0.0 if step.reward is None else float(step.reward))
        return ids

    def seen(self) -> None:
        """The last observation is in the trace's context: its call and its tokens count. (One the
        caps cut off is never read by the model, so a tool call at the last turn counts nothing.)"""
        self.count(self.pending)

    def count(self, numbers: dict) -> None:
        for name, value in numbers.items():
            self.details[name] = self.details.get(name, 0) + value


class Observations:
    """An observation's token ids as the next turn's context: a "tool" message of the chat template
    (what follows the assistant's end-of-turn, up to and including the next assistant header), or
    the plain text where the template has no tool role (or chat templates are off). The text is
    tokenised with special-token text split (a program printing "<|im_end|>" writes characters, not
    a turn boundary); the frame's special tokens are the template's own."""

    def __init__(self, tokenizer, chat_template: bool):
        self.tokenizer, self.frame = tokenizer, None
        # sessions answer from threads (environments/rollout.py's answers); a tokenizer is not thread-safe
        self.lock = threading.Lock()
        if chat_template and tokenizer.chat_template:
            self.frame = tool_frame(tokenizer)
            if self.frame is None:
                warnings.warn("--env: the chat template renders no tool message; observations are appended as "
                              "plain text in the tool's own frame")

    def __call__(self, text: str, cap: int, plain: tuple[str, str], turn: str = "") -> list[int]:
        """text cut to `cap` tokens, framed by the template's tool message or by `plain` -> ids. A
        plain frame's start that the turn already wrote (it stopped at the stop string "```output") is
        not written again: turn "...```output", plain ("```output\n", ...) -> "\n" + text + ..."""
        before, after = self.frame or plain
        if self.frame is None:
            before = before[next((k for k in range(len(before), 0, -1) if turn.endswith(before[:k])), 0):]
        with self.lock:
            ids = self.tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"][:cap]
            return [*self.ids(before), *ids, *self.ids(after)]

    def ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"] if text else []


TURN, TOOL = "SENTINELTURN7f3a", "SENTINELTOOL9c2b"  # plain letters: a template that escapes (tojson) keeps them


def tool_frame(tokenizer) -> tuple[str, str] | None:
    """The text the chat template puts around a tool message after an assistant turn ends, up to
    the next assistant header; None when the template has no tool role. Read off one render of
    user, assistant, tool and the generation prompt (a template may render a last assistant turn
    differently, as Qwen3's does). The tiny model's template: ("<|tool|>", "<|assistant|>") (its
    assistant turn ends with <eos>, the token the model wrote)."""
    chat = [{"role": "user", "content": "u"}, {"role": "assistant", "content": TURN}, {"role": "tool", "content": TOOL}]
    try:
        framed = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    except Exception:  # noqa: BLE001 - a template that refuses the tool role has none
        return None
    if TURN not in framed or TOOL not in framed or framed.index(TURN) > framed.index(TOOL):
        return None
    # what follows the assistant's text: its end-of-turn (written by the model: its stop id), then the frame
    rest = framed[framed.index(TURN) + len(TURN):]
    eos = tokenizer.decode(stop_id_of(tokenizer))
    rest = rest[len(eos):] if eos and rest.startswith(eos) else rest
    before, _, after = rest.partition(TOOL)
    return before, after


def stop_id_of(tokenizer) -> list[int]:
    """The stop id an assistant turn ends with: the first of model.load_tokenizer's list, or EOS."""
    return (getattr(tokenizer, "stop_ids", None) or [tokenizer.eos_token_id])[:1]


class Environments:
    """--env as the rollout uses it: called with a problem, the Session of a new trace; `tools`, the
    schemas to list in the prompt through the chat template (the built-in tools; None for a user's
    class, whose prompt is the task's)."""

    def __init__(self, make, render: Observations, cap: int, tools: list[dict] | None = None, notes=(), pool=None,
                 stop_strings: tuple = ()):
        self.make, self.render, self.cap, self.tools, self.pool = make, render, cap, tools, pool
        self.stop_strings = tuple(stop_strings)  # text that ends a turn (rollout.StopStrings)
        self.warnings = tuple(notes)  # said once by train.py and eval.py (a sandbox weaker than bubblewrap)

    def __call__(self, problem: Problem) -> Session:
        return Session(self.make(problem), self.render, self.cap)

    def round(self):
        """What one round of turns runs in: a user's class, its budget (UserEnvironment.round); the
        built-in tools bound each call themselves (the sandbox's limits)."""
        return self.pool.round() if self.pool is not None else contextlib.nullcontext()


def environment_for(spec: str, turns: Turns, tokenizer, chat_template: bool, timeout: float = 10.0,
                    sandbox: tuple = ("auto", 5.0, 1024), budget: float = 0.0):
    """--env spec -> Environments (None for "", the single-turn rollout). Checked here, before any
    model loads: a user's class (its file read, one worker started), the python tool's sandbox
    (`sandbox`: --sandbox, --sandbox-timeout, --sandbox-memory); a DataError names what is wrong."""
    if not spec:
        return None
    render, cap = Observations(tokenizer, chat_template), turns.max_observation_tokens
    # a built-in tool's plain-text call ends its turn only where the chat template frames no tool call
    plain = render.frame is None
    if spec == "calculator":
        return Environments(Calculator, render, cap, [Calculator.schema()],
                            stop_strings=Calculator.stop_strings if plain else ())
    if spec == "python":
        return Environments(PythonTool, render, cap, [PythonTool.schema()], PythonTool.prepare(*sandbox),
                            stop_strings=PythonTool.stop_strings if plain else ())
    if plugin_spec(spec) is None:
        raise DataError(f"--env {spec!r}: give calculator, python or path/to/file.py:Class")
    from environments.worker import UserEnvironment
    pool = UserEnvironment(spec, timeout=timeout, max_chars=cap * Session.MAX_CHARS_PER_TOKEN, budget=budget)
    pool.check()
    return Environments(lambda problem: WorkerEnvironment(problem, pool), render, cap, pool=pool,
                        stop_strings=pool.stop_strings)
