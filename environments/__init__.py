"""Multi-turn rollouts: the environment seam (`--env`); tools from functions: environments/tools.py.

A trace is the model's turns interleaved with observations:

    prompt (the task's) -> turn 1 -> observation 1 -> turn 2 -> ... -> turn k (done)

After each turn that ends with a stop id, the trace's environment reads the turn (decoded text) and
answers with a `Step`: an observation to append and the model writes the next turn, or
`observation=None`: the trace is done, with the environment's reward or, when it gives none, the
task's grade of the last turn. An observation is one message (a str) or several (a list of str,
e.g. the outputs of a turn's tool calls, one each); each is rendered as a "tool" message of the
model's chat template when the template has one (Qwen2.5's, Llama 3's, the tiny model's), else
appended as plain text in the environment's `plain` frame; its tokens are context for the next turn
and never trained (environments/rollout.py: every turn is a training row whose prompt holds all
that came before, docs/math.md §8).

    --env calculator          every <calc>EXPR</calc> (or calculator call) of a turn gets EXPR's exact value back
    --env python              every ```python block (or python call) of a turn gets the program's stdout back
    --env path/file.py:Class  your own: Class(problem) with step(turn) -> Step, run in worker
                              processes (environments/worker.py), bounded like a --reward function;
                              a class may list tools (functions), which the chat template lists too

Why this interface: it is tinker-cookbook's `Env` (an initial observation, then `step(action)` ->
reward, done, next observation) without the first call, because the task already makes each
problem's first prompt (its template, the chat template), so an environment only has to answer
turns; and it takes and returns text, because tools read text, while the token bookkeeping (the
chat template, the caps, the mask) stays in one place, here and in environments/rollout.py. One environment
object per trace, so a tool may keep state across the turns of its trace.

Bounds: a turn cap (--max-turns), an observation cap in tokens (--max-observation-tokens, all its
messages together: `fair_cut`), at most MAX_MESSAGES messages, and a context cap per trace
(--max-trace-tokens). An environment that raises, hangs (--env-timeout, for a user's class),
answers with something else than a Step of text, or returns megabytes ends its trace with reward
0, counted in env/failures; the run goes on. Logged per trace, averaged:
turns/mean, tools/calls, tools/errors, tools/correct (calls whose value equals the gold answer),
length/observation (observation tokens), env/failures.
"""
from __future__ import annotations

import contextlib
import itertools
import threading
import warnings
from dataclasses import dataclass, field

from rewards import DataError, Problem, is_reward, plugin_spec


@dataclass
class Step:
    """An environment's answer to one turn."""
    observation: str | list[str] | None = None  # the message(s) the model reads next (tools' outputs); None: done
    reward: float | None = None  # when done: the trace's reward (None: the task grades the last turn); with an
    # observation: this turn's reward, which --turn-credit turns into advantages (docs/math.md §8)
    details: dict = field(default_factory=dict)  # numbers to log, summed over the trace's turns


class Environment:
    """The world of one trace, built with its problem. The default answers every turn with "done":
    a single-turn rollout, graded by the task."""

    plain = ("", "")  # the text around each message of an observation where the chat template has no tool role
    stop_strings: tuple = ()  # text that ends a turn where it first appears, kept (a plain-text call's end)
    done_reason = "done"  # why a trace ends when step says done (stop/...): a tool environment's "no_call"

    def __init__(self, problem: Problem):
        self.problem = problem

    def step(self, turn: str) -> Step:
        """The model's latest turn (decoded, special tokens dropped) -> what happens next."""
        return Step()


# ----------------------------------------------------------------------------- a user's environment

class WorkerEnvironment(Environment):
    """One trace of a `--env file.py:Class`: its turns go to environments.worker.UserEnvironment, which runs
    the class in a worker process, bounded; a failure there is a failed Step (Session counts it). Its
    plain frame and done reason are the class's, read by the pool's start-up check."""

    keys = itertools.count()  # a trace's key in the worker pool, unique in this process

    def __init__(self, problem: Problem, pool):
        super().__init__(problem)
        self.pool, self.key, self.turns = pool, f"trace-{next(WorkerEnvironment.keys)}", []
        self.plain, self.done_reason = pool.plain, pool.done_reason

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
    max_observation_tokens: int = 256  # tokens of one observation's text, all its messages (framing on top)
    max_tokens: int = 0  # a trace's context at most: query + turns + observations + the next turn's budget; 0 = no cap


# why a trace ended: the environment said done (or failed), the tool environment found no call in the
# turn, the turn cap, the context cap (--max-trace-tokens or the model's), a turn cut at max_new_tokens
STOPS = ("done", "failed", "no_call", "max_turns", "context", "length")
# what the rollout counts; an environment's details may not
OWN = {"env/failures", "length/observation", "turns/mean", "turns/reward", *(f"stop/{s}" for s in STOPS)}
MAX_MESSAGES = 16  # messages of one observation at most: a turn's tool calls past it are not run


def messages_of(observation) -> list[str] | None:
    """An observation's messages, as plain str: "14198" -> ["14198"]; ["1/2", "20"] -> ["1/2", "20"];
    None for anything else (a list of none or more than MAX_MESSAGES, or of something else than str)."""
    observation = [observation] if isinstance(observation, str) else observation
    if not isinstance(observation, list) or not 1 <= len(observation) <= MAX_MESSAGES \
            or not all(isinstance(m, str) for m in observation):
        return None
    # str.__str__: a str subclass as a plain str, whatever its own __str__ or slicing does
    return [str.__str__(m) for m in observation]


def fair_cut(parts: list, cap: int) -> list:
    """Each part (a message's text or token ids) cut so that all together hold at most `cap` items:
    the short parts whole, the long ones sharing what is left equally, so that one flood of output
    does not hide the other calls' answers. Lengths [3, 50, 50], cap 20 -> [3, 8, 9]; ["abcdef"], 4 -> ["abcd"]."""
    kept, left = list(parts), cap
    for k, i in enumerate(sorted(range(len(parts)), key=lambda i: len(parts[i]))):
        kept[i] = parts[i][:left // (len(parts) - k)]
        left -= len(kept[i])
    return kept


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
            messages = None if step.observation is None else messages_of(step.observation)
            if step.observation is not None and messages is None:
                raise EnvironmentFailed(f"observation is {type(step.observation).__name__}, not text or a list of "
                                        f"1 to {MAX_MESSAGES} texts")
            if step.reward is not None and not is_reward(step.reward):
                raise EnvironmentFailed(f"reward {step.reward!r} is not a number")
            numbers = {name: float(value) for name, value in step.details.items()}
            if set(numbers) & OWN:
                raise EnvironmentFailed(f"details may not set {', '.join(sorted(set(numbers) & OWN))}")
            ids = None if messages is None else \
                self.render(fair_cut(messages, self.cap * self.MAX_CHARS_PER_TOKEN), self.cap, self.env.plain, turn)
        except Exception as e:  # noqa: BLE001 - an environment's bug (or text no tokenizer takes) ends its trace, never the run
            self.reward, self.details["env/failures"], self.stop = 0.0, 1, "failed"
            self.error = f"{type(e).__name__}: {e}" if not isinstance(e, EnvironmentFailed) else str(e)
            return None
        if ids is None:
            self.reward = None if step.reward is None else float(step.reward)
            self.count(numbers)
            self.stop = self.env.done_reason
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
    """An observation's token ids as the next turn's context: its messages as "tool" messages of the
    chat template (what follows the assistant's end-of-turn, up to and including the next assistant
    header), or as plain text where the template has no tool role (or chat templates are off). The
    text is tokenised with special-token text split (a program printing "<|im_end|>" writes
    characters, not a turn boundary); the frame's special tokens are the template's own."""

    def __init__(self, tokenizer, chat_template: bool, chat_kwargs: dict | None = None):
        self.tokenizer, self.frame, self.chat_kwargs = tokenizer, None, chat_kwargs or {}
        # sessions answer from threads (environments/rollout.py's answers); a tokenizer is not thread-safe
        self.lock = threading.Lock()
        if chat_template and tokenizer.chat_template:
            self.frame = tool_frame(tokenizer, 1, self.chat_kwargs)
            if self.frame is None:
                warnings.warn("--env: the chat template renders no tool message; observations are appended as "
                              "plain text in the tool's own frame")
        self.frames = {1: self.frame}  # n -> the frame of n tool messages in a row, read once each

    def __call__(self, texts: str | list[str], cap: int, plain: tuple[str, str], turn: str = "") -> list[int]:
        """An observation's messages -> ids: each tokenised, all together cut to `cap` tokens
        (fair_cut), framed as the template renders that many tool messages in a row (tool_frame),
        or each in `plain`, one after another. A plain frame's start that the turn already wrote (it
        stopped at the stop string "```output") is not written again, for the first message: turn
        "...```output", plain ("```output\n", "\n```\n"), ["1", "2"] -> "\n1\n```\n```output\n2\n```\n"."""
        texts = [texts] if isinstance(texts, str) else texts
        with self.lock:
            if self.frame is None:
                written = next((k for k in range(len(plain[0]), 0, -1) if turn.endswith(plain[0][:k])), 0)
                frame = (plain[0][written:], *[plain[1] + plain[0]] * (len(texts) - 1), plain[1])
            else:
                if len(texts) not in self.frames:
                    self.frames[len(texts)] = tool_frame(self.tokenizer, len(texts), self.chat_kwargs)
                frame = self.frames[len(texts)]
                if frame is None:  # a template that renders one tool message but not several in a row
                    texts, frame = ["\n\n".join(texts)], self.frame
            messages = fair_cut([self.tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
                                 for text in texts], cap)
            ids = self.ids(frame[0])
            for message, after in zip(messages, frame[1:]):
                ids += message + self.ids(after)
            return ids

    def ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"] if text else []


TURN, TOOL = "SENTINELTURN7f3a", "SENTINELTOOL9c2b"  # plain letters: a template that escapes (tojson) keeps them


def tool_frame(tokenizer, n: int = 1, chat_kwargs: dict | None = None) -> tuple[str, ...] | None:
    """The text the chat template puts around n tool messages in a row after an assistant turn ends,
    up to the next assistant header: n + 1 pieces (before the first message, between each two, after
    the last); None when the template has no tool role. Read off one render of user, assistant, n
    tool messages and the generation prompt (a template may render a last assistant turn
    differently, as Qwen3's does, or group a run of tool messages into one turn, as Qwen2.5's does).
    The tiny model's template: ("<|tool|>", "<|assistant|>"); n = 2: ("<|tool|>", "<|tool|>",
    "<|assistant|>") (its assistant turn ends with <eos>, the token the model wrote). chat_kwargs: the run's
    --chat-template-kwargs, so that a turn's generation prompt is the first one's (Qwen3's enable_thinking)."""
    tools = [f"{TOOL}{i}x" for i in range(n)]  # the x ends each: none is a part of another
    chat = [{"role": "user", "content": "u"}, {"role": "assistant", "content": TURN},
            *({"role": "tool", "content": tool} for tool in tools)]
    try:
        framed = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False, **(chat_kwargs or {}))
    except Exception:  # noqa: BLE001 - a template that refuses the tool role has none
        return None
    at = [framed.find(sentinel) for sentinel in (TURN, *tools)]
    if -1 in at or at != sorted(at):
        return None
    # what follows the assistant's text: its end-of-turn (written by the model: its stop id), then the frame
    rest = framed[at[0] + len(TURN):]
    eos = tokenizer.decode(stop_id_of(tokenizer))
    rest = rest[len(eos):] if eos and rest.startswith(eos) else rest
    pieces = []
    for tool in tools:
        piece, _, rest = rest.partition(tool)
        pieces.append(piece)
    return (*pieces, rest)


def stop_id_of(tokenizer) -> list[int]:
    """The stop id an assistant turn ends with: the first of model.load_tokenizer's list, or EOS."""
    return (getattr(tokenizer, "stop_ids", None) or [tokenizer.eos_token_id])[:1]


class Environments:
    """--env as the rollout uses it: called with a problem, the Session of a new trace; `tools`, the
    schemas to list in the prompt through the chat template (a built-in tool's, or those a user's
    class declares; None for none: the prompt is the task's)."""

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
                    sandbox: tuple = ("auto", 5.0, 1024), budget: float = 0.0, chat_kwargs: dict | None = None):
    """--env spec -> Environments (None for "", the single-turn rollout). Checked here, before any
    model loads: a user's class (its file read, one worker started), the python tool's sandbox
    (`sandbox`: --sandbox, --sandbox-timeout, --sandbox-memory); a DataError names what is wrong."""
    if not spec:
        return None
    render, cap = Observations(tokenizer, chat_template, chat_kwargs), turns.max_observation_tokens
    # a built-in tool's plain-text call ends its turn only where the chat template frames no tool call
    plain = render.frame is None
    if spec == "calculator":
        from environments.tools import Calculator
        return Environments(Calculator, render, cap, Calculator.schemas(),
                            stop_strings=Calculator.stop_strings if plain else ())
    if spec == "python":
        from environments.tools import PythonTool
        return Environments(PythonTool, render, cap, PythonTool.schemas(), PythonTool.prepare(*sandbox),
                            stop_strings=PythonTool.stop_strings if plain else ())
    if plugin_spec(spec) is None:
        raise DataError(f"--env {spec!r}: give calculator, python or path/to/file.py:Class")
    from environments.worker import UserEnvironment
    pool = UserEnvironment(spec, timeout=timeout, max_chars=cap * Session.MAX_CHARS_PER_TOKEN, budget=budget)
    pool.check()
    return Environments(lambda problem: WorkerEnvironment(problem, pool), render, cap, pool.tools or None, pool=pool,
                        stop_strings=pool.stop_strings)
