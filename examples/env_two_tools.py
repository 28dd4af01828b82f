"""An environment with two tools, each a plain function: the chat template lists them in the prompt,
and every call of a turn runs.

    python train.py --env examples/env_two_tools.py:Adder --max-steps 2
    python train.py --model PATH --env examples/env_two_tools.py:Adder --max-turns 4   # a chat model with tools

On the default task (running sums: "Add 4821+9377", gold "14198"), a model that writes

    <tool_call>{"name": "read_numbers", "arguments": {"text": "Add 4821+9377"}}</tool_call>

reads "[4821, 9377]" back as a tool message, then writes

    <tool_call>{"name": "add", "arguments": {"numbers": [4821, 9377]}}</tool_call>

reads "14198", and answers <answer>14198</answer>: a turn without a call ends the trace, graded by the
task. The calls of one turn all run, in order, one tool message each. The shipped tiny model writes
no <tool_call> and its template lists no tools, so with it every trace is one turn (stop/no_call);
a chat model whose template lists tools (Qwen2.5-Instruct's, Qwen3's) calls them.

A tool is a function with type hints and a Google-style docstring: transformers.utils.get_json_schema
reads it into the JSON schema the template lists, and a call whose arguments do not fit it is not run
(tools/parse_errors). The class runs in a worker process (environments/worker.py), where the schemas
are read at start-up; ToolEnvironment (environments/tools.py) finds the calls, runs them and counts
tools/calls, tools/errors and tools/correct (outputs equal to the gold answer).
"""
import re

from environments.tools import ToolEnvironment


def read_numbers(text: str) -> list[int]:
    """The whole numbers written in a text, in order.

    Args:
        text: any text, e.g. the problem: "Add 4821+9377"
    """
    return [int(n) for n in re.findall(r"\d+", text)]


def add(numbers: list[int]) -> int:
    """The exact sum of integers.

    Args:
        numbers: the integers to add, e.g. [4821, 9377]
    """
    return sum(numbers)


class Adder(ToolEnvironment):
    tools = (read_numbers, add)
