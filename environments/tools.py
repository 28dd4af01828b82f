"""Tools from plain functions, and the two built-in ones (`--env calculator`, `--env python`).

A tool is a Python function with type hints and a Google-style docstring (its `Args:` section says
what each argument is); its JSON schema, which the chat template lists in the prompt, is
transformers' own `transformers.utils.get_json_schema(fn)`. An environment lists its tools, as
examples/env_two_tools.py does:

    class Adder(ToolEnvironment):
        tools = (read_numbers, add)      # def add(numbers: list[int]) -> int: ..., documented

The rules of a turn (ToolEnvironment.step):
- a call is written as the chat template writes tool calls (Qwen2.5, Qwen3, Hermes:
  <tool_call>{"name": NAME, "arguments": {...}}</tool_call>) or in a tool's plain form
  (`plain_calls`: the calculator's <calc>EXPR</calc>, Qwen2.5-Math's ```python block);
- every call of the turn runs, in the order written, at most MAX_MESSAGES; each output is one
  message of the observation, one tool message of the chat template each;
- a <tool_call> body runs when it is JSON (of at most MAX_CALL_CHARS characters) naming a listed
  tool, with arguments that bind to the function's signature, each of its schema's simple JSON type
  (string, integer, number, boolean, array, object; a bool is neither an integer nor a number; what
  an array or object holds is not checked); any other body is not run and counts in
  tools/parse_errors, as do calls past MAX_MESSAGES;
- a turn without a call that runs ends the trace: the task grades it (stop/no_call);
- a call's output is the tool's return value (a str as it is, anything else as JSON); a tool that
  raises ToolError gives its message verbatim, any other exception "error: <message>", either
  counted in tools/errors; EnvironmentFailed (the sandbox killed a program) ends the trace with
  reward 0.
Counted per turn: tools/calls (calls run), tools/errors, tools/correct (outputs equal to the gold
answer, stripped), tools/parse_errors.
"""
from __future__ import annotations

import functools
import inspect
import json
import re
import textwrap
import threading

from transformers.utils import get_json_schema

from environments import MAX_MESSAGES, Environment, EnvironmentFailed, Step
from grading.countdown import parse_arithmetic


class ToolError(Exception):
    """A tool's failure whose message is what the model reads, verbatim."""


class ToolEnvironment(Environment):
    """Runs every call of a turn and answers with their outputs, one message each; a turn without a
    call ends the trace (the module docstring's rules). A subclass lists its `tools` and may read
    their plain forms (`plain_calls`)."""

    tools: tuple = ()  # the functions a turn may call, by their names
    done_reason = "no_call"  # a turn it answers with done wrote no call that runs
    MAX_CALL_CHARS = 16384  # a <tool_call> body longer than this is not read as JSON

    def __init__(self, problem):
        super().__init__(problem)
        self.by_name = {fn.__name__: fn for fn in self.tools}

    @classmethod
    def schemas(cls) -> list[dict]:
        """The tools as the chat template lists them (`apply_chat_template(tools=...)`)."""
        return [schema_of(fn) for fn in cls.tools]

    def plain_calls(self, turn: str) -> list[tuple[int, str, dict]]:
        """The turn's calls in a tool's plain form: (where each starts, the tool's name, its arguments)."""
        return []

    def calls(self, turn: str) -> tuple[list[tuple[str, dict]], int]:
        """(the turn's calls that run, as (tool, arguments) in the order written; how many do not).
        '<calc>1+1</calc> <tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>'
        -> ([("calculator", {"expression": "1+1"}), ("calculator", {"expression": "2+3"})], 0)."""
        found, unread = list(self.plain_calls(turn)), 0
        for m in TOOL_CALL.finditer(turn):
            call = self.read(m.group(1))
            if call is None:
                unread += 1
            else:
                found.append((m.start(), *call))
        found = [(name, arguments) for _, name, arguments in sorted(found, key=lambda call: call[0])]
        return found[:MAX_MESSAGES], unread + len(found[MAX_MESSAGES:])

    def read(self, body: str) -> tuple[str, dict] | None:
        """A <tool_call> body as (tool, arguments); None when it is not a call that fits a listed tool."""
        try:
            call = json.loads(body) if len(body) <= self.MAX_CALL_CHARS else None
        except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
            return None
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return None
        fn, arguments = self.by_name.get(call["name"]), call.get("arguments")
        return (call["name"], arguments) if fn and isinstance(arguments, dict) and fits(fn, arguments) else None

    def run(self, name: str, arguments: dict) -> tuple[str, bool]:
        """(the call's output, whether the tool failed), as the module docstring says."""
        try:
            value = self.by_name[name](**arguments)
            return (value if isinstance(value, str) else json.dumps(value, default=str)), False
        except ToolError as e:
            return str(e), True
        except EnvironmentFailed:
            raise
        except Exception as e:  # noqa: BLE001 - a tool's error is the model's to read, and to fix
            return f"error: {e}", True

    def step(self, turn: str) -> Step:
        calls, unread = self.calls(turn)
        if not calls:
            return Step(details={"tools/parse_errors": unread})
        ran = [self.run(name, arguments) for name, arguments in calls]
        gold = self.problem.answer.strip()
        return Step([output for output, _ in ran], details={
            "tools/calls": len(ran), "tools/errors": sum(failed for _, failed in ran),
            "tools/correct": sum(not failed and output.strip() == gold for output, failed in ran),
            "tools/parse_errors": unread})


TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)


@functools.cache
def schema_of(fn) -> dict:
    """fn's JSON schema, transformers.utils.get_json_schema's (read once a function: every call checks
    against it). calculator -> {"type": "function", "function": {"name": "calculator", "description":
    "Exact arithmetic: ...", "parameters": {"type": "object", "properties": {"expression": {"type":
    "string", "description": ...}}, "required": ["expression"]}, "return": {"type": "string"}}}."""
    return get_json_schema(fn)


JSON_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "array": list,
              "object": dict, "null": type(None)}


def fits(fn, arguments: dict) -> bool:
    """Whether a call's arguments bind to fn's signature, each of its schema's simple JSON type.
    calculator: {"expression": "2+3"} -> True; {"expression": 5}, {}, {"expr": "2+3"} -> False."""
    try:
        inspect.signature(fn).bind(**arguments)
    except TypeError:
        return False
    properties = schema_of(fn)["function"]["parameters"].get("properties", {})
    return all(of_type(value, properties.get(name, {})) for name, value in arguments.items())


def of_type(value, schema: dict) -> bool:
    """value is of one of the schema's simple JSON types (a type it does not name, anyOf, ...: yes).
    5, {"type": "integer"} -> True; True, {"type": "integer"} -> False; None, {"type": "string",
    "nullable": True} -> True."""
    names = schema.get("type")
    if names is None:
        return True
    names = [names] if isinstance(names, str) else list(names)
    names += ["null"] if schema.get("nullable") else []
    return any(name not in JSON_TYPES or isinstance(value, JSON_TYPES[name])
               and not (isinstance(value, bool) and name in ("integer", "number")) for name in names)


# ----------------------------------------------------------------------------- the built-in tools

CALCULATOR_MAX_CHARS = 200  # longer expressions are refused before parsing


def calculator(expression: str) -> str:
    """Exact arithmetic: + - * / and parentheses over integers; the value, an integer or a fraction.

    Args:
        expression: integers joined by + - * / and parentheses, e.g. "4821+9377" or "(1/3+1/6)*4"
    """
    if len(expression) > CALCULATOR_MAX_CHARS:
        raise ValueError(f"longer than {CALCULATOR_MAX_CHARS} characters")
    # a bounded parser, never Python's eval; its ExpressionError reads "error: division by zero"
    value, _ = parse_arithmetic(expression)
    return str(value)  # Fraction's str: "14198", "1/2"


class Calculator(ToolEnvironment):
    """--env calculator: `calculator`, called in the chat template's form or in its plain form,
    <calc>EXPR</calc>, whose output comes back as <result>VALUE</result> where the template has no
    tool role. "so <calc>4821+9377</calc>" -> ["14198"]; "<calc>1/3+1/6</calc> <calc>1/0</calc>" ->
    ["1/2", "error: division by zero"]."""

    tools = (calculator,)
    plain = ("<result>", "</result>")
    stop_strings = ("</calc>",)

    def plain_calls(self, turn: str) -> list[tuple[int, str, dict]]:
        return [(m.start(), "calculator", {"expression": m.group(1)})
                for m in re.finditer(r"<calc>(.*?)</calc>", turn, re.S)]


def python(code: str) -> str:
    """Runs a Python program (standard library only) and returns what it prints.

    Args:
        code: the whole program, run as a fresh process (nothing is kept from earlier calls)
    """
    result = PythonTool.sandbox().run(code)
    if result.killed:  # past the time or output limit, or never started: the trace ends, scored 0
        raise EnvironmentFailed(f"the sandbox ended the program: {result.killed}")
    out = result.stdout.decode(errors="replace")
    if not result.ok:  # its error's last line, so that the model may fix its code
        raise ToolError((out + (result.stderr.decode(errors="replace").strip().splitlines() or ["error"])[-1]).strip())
    return out


class PythonTool(ToolEnvironment):
    """--env python: `python`, called in the chat template's form or as a ```python block (Qwen2.5-Math's
    tool-integrated format, its output in a ```output block). The program runs in the sandbox
    (grading/sandbox.py: its own process, limits, namespaces where the machine has them) and its
    stdout comes back, with its stderr's last line when it fails; a program the sandbox has to kill
    (time, output) ends the trace with reward 0. Each call is a fresh program: no state is kept
    between the calls of a trace (a long-lived interpreter per trace would be a process per trace
    outliving its turns; a model that needs earlier values writes them again, as in the ToRL
    recipe's one-shot runs)."""

    tools = (python,)
    plain = ("```output\n", "\n```\n")
    stop_strings = ("```output",)  # where Qwen2.5-Math's and ToRL's turns end, the output's fence kept
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

    @classmethod
    def sandbox(cls):
        """The process's sandbox; made with the defaults where environment_for did not (tests, your code)."""
        with PythonTool.making:  # traces answer from threads (environments/rollout.py's answers); one sandbox for all
            if PythonTool.box is None:
                PythonTool.prepare()
            return PythonTool.box

    def plain_calls(self, turn: str) -> list[tuple[int, str, dict]]:
        """Every closed ```python block, read as code problems read a response's program."""
        from grading.code import python_blocks
        return [(opened, "python", {"code": textwrap.dedent(turn[start:end])})
                for opened, start, end in python_blocks(turn)]
