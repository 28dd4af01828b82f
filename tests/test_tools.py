"""Tools from plain functions (environments/tools.py): the schema is transformers' get_json_schema, a
call's arguments are checked against the function, every call of a turn runs in order and comes back
as one tool message each, a user's class declares its tools through the worker, and the two-tool
example (examples/env_two_tools.py) calls both."""
import json
import re

import pytest
from transformers.utils import get_json_schema

from environments import Observations, Session, Step, Turns, environment_for
from environments.rollout import MultiTurn
from environments.tools import Calculator, PythonTool, ToolEnvironment, ToolError, calculator, fits, of_type, python
from model import load_tokenizer
from rewards import DataError, Problem
from rollout import Sampling, encode_prompts, generate
from test_multi_turn import HERMES, QWEN25, TINY, tokenizer_with

TWO_TOOLS = "examples/env_two_tools.py:Adder"
SUM = Problem("Add 4821+9377", "14198")


def call(name: str, **arguments) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def test_a_tools_schema_is_transformers_own():
    """The built-in tools are functions; their schemas, what the chat template lists, are get_json_schema's."""
    assert Calculator.schemas() == [get_json_schema(calculator)] and PythonTool.schemas() == [get_json_schema(python)]
    assert get_json_schema(calculator)["function"]["parameters"] == {
        "type": "object", "required": ["expression"], "properties": {"expression": {
            "type": "string", "description": 'integers joined by + - * / and parentheses, e.g. "4821+9377" or '
                                             '"(1/3+1/6)*4"'}}}
    assert calculator("4821+9377") == "14198" and calculator("1/3+1/6") == "1/2"


@pytest.mark.parametrize("arguments,ok", [
    ({"numbers": [4821, 9377]}, True),
    ({"numbers": []}, True),
    ({"numbers": "4821+9377"}, False),  # a string where the schema says array
    ({}, False),  # a required argument missing
    ({"numbers": [1], "carry": 0}, False),  # an argument the function does not take
    ({"numbers": None}, False),
])
def test_a_calls_arguments_bind_to_the_function_and_its_schemas_types(arguments, ok):
    from examples.env_two_tools import add
    assert fits(add, arguments) == ok


def test_a_bool_is_neither_an_integer_nor_a_number():
    assert of_type(5, {"type": "integer"}) and of_type(5, {"type": "number"}) and of_type(2.5, {"type": "number"})
    assert not of_type(True, {"type": "integer"}) and not of_type(False, {"type": "number"})
    assert of_type(True, {"type": "boolean"}) and not of_type(1, {"type": "boolean"})
    assert of_type(None, {"type": "string", "nullable": True}) and not of_type(None, {"type": "string"})
    assert of_type(3, {"type": ["string", "integer"]}) and of_type([1], {"anyOf": [{"type": "array"}]})


def raises_tool_error(text: str) -> str:
    """Fails in words the model reads as they are.

    Args:
        text: what to say
    """
    raise ToolError(f"no: {text}")


def count(items: list, flag: bool = False) -> int:
    """How many items there are.

    Args:
        items: anything
        flag: unused
    """
    return len(items)


class Mixed(ToolEnvironment):
    tools = (calculator, raises_tool_error, count)


def test_every_call_of_a_turn_runs_in_order_and_only_calls_that_fit():
    """Two good calls of different tools, a ToolError, an error of another kind, and three bodies that are
    not run (not JSON, a tool not listed, an integer for a boolean): four messages, in the order written."""
    turn = " ".join([call("count", items=[1, 2, 3]), call("raises_tool_error", text="x"), "<tool_call>{</tool_call>",
                     call("calculator", expression="1/0"), call("python", code="print(1)"),
                     call("count", items=[], flag=1), call("calculator", expression="14198")])
    step = Mixed(Problem("p", "14198")).step(turn)
    assert step.observation == ["3", "no: x", "error: division by zero", "14198"]
    assert step.details == {"tools/calls": 4, "tools/errors": 2, "tools/correct": 1, "tools/parse_errors": 3}


def test_calls_past_max_messages_are_not_run_but_counted():
    from environments import MAX_MESSAGES
    step = Calculator(Problem("p", "2")).step("<calc>1+1</calc>" * (MAX_MESSAGES + 3))
    assert step.observation == ["2"] * MAX_MESSAGES and step.details["tools/parse_errors"] == 3


def test_a_tool_the_sandbox_ends_ends_the_trace_with_reward_0():
    """EnvironmentFailed from a tool (python's: the sandbox killed the program) is no tool error the model
    reads: the trace ends, scored 0, counted in env/failures."""
    from environments import EnvironmentFailed

    def killed(code: str) -> str:
        """Always killed.

        Args:
            code: a program
        """
        raise EnvironmentFailed("the sandbox ended the program: time")

    class Killing(ToolEnvironment):
        tools = (killed,)

    session = Session(Killing(Problem("p", "1")), Observations(load_tokenizer(TINY), True), 32)
    assert session.answer(call("killed", code="while True: pass")) is None
    assert session.reward == 0.0 and session.details["env/failures"] == 1 and session.stop == "failed"


# ----------------------------------------------------------------------------- the two-tool example

def test_the_two_tool_example_calls_both_tools_in_process():
    """examples/env_two_tools.py's Adder, stepped by hand: each tool answers its call; both calls of one
    turn run, in order; a turn without a call ends the trace (done, the task grades it)."""
    from examples.env_two_tools import Adder
    env = Adder(SUM)
    first = env.step(call("read_numbers", text=SUM.prompt))
    assert first.observation == ["[4821, 9377]"] and first.details["tools/calls"] == 1
    both = env.step(call("add", numbers=[4821, 9377]) + "\n" + call("read_numbers", text="Add 1+2"))
    assert both.observation == ["14198", "[1, 2]"]
    assert both.details == {"tools/calls": 2, "tools/errors": 0, "tools/correct": 1, "tools/parse_errors": 0}
    assert env.step("<answer>14198</answer>") == Step(details={"tools/parse_errors": 0})


def scripted_turns(monkeypatch, tok, turns: list[str]):
    """rollout.sample writes `turns` in order, one a round, each ended by the tokenizer's stop id."""
    import rollout
    stop = tok.stop_ids[0]
    written = iter([tok(t, add_special_tokens=False)["input_ids"] + [stop] for t in turns])

    def sample(lm, tokenizer, rows, sampling, **_):
        return [(ids, [0.0] * len(ids)) for ids in (next(written) for _ in rows)]
    monkeypatch.setattr(rollout, "sample", sample)


@pytest.mark.slow
def test_the_two_tool_example_in_a_worker_answers_two_calls_with_two_tool_messages(monkeypatch):
    """Adder as `--env examples/env_two_tools.py:Adder` (a worker process), Qwen2.5's template: turn 1 calls
    both tools; turn 2's context holds both outputs, in order, as two <tool_response> blocks of one user
    turn (Qwen2.5's grouping); turn 2 answers without a call, so the trace ends with stop/no_call. The
    prompt lists both tools' schemas, computed in the worker."""
    tok = tokenizer_with(QWEN25)
    environments = environment_for(TWO_TOOLS, Turns(max_turns=3), tok, True, timeout=30)
    try:
        from examples.env_two_tools import add, read_numbers
        assert environments.tools == [get_json_schema(read_numbers), get_json_schema(add)]
        [query] = encode_prompts(tok, [SUM], True, environments.tools)
        assert all(json.dumps(s, ensure_ascii=False) in tok.decode(query) for s in environments.tools)
        scripted_turns(monkeypatch, tok, [call("read_numbers", text=SUM.prompt) + call("add", numbers=[4821, 9377]),
                                          "<answer>14198</answer>"])
        [e] = generate(None, tok, [SUM], [query], group_size=1, sampling=Sampling(max_new_tokens=200),
                       shape=MultiTurn(environments, Turns(max_turns=3)))
    finally:
        environments.pool.close()
    turn_1, turn_2 = e.chunks
    between = tok.decode(turn_2.prompt_ids[len(turn_1.prompt_ids) + len(turn_1.response_ids):])
    assert between == ("\n<|im_start|>user\n<tool_response>\n[4821, 9377]\n</tool_response>\n<tool_response>\n14198"
                       "\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert e.text == "<answer>14198</answer>" and e.details["stop/no_call"] == 1
    assert (e.details["tools/calls"], e.details["tools/correct"], e.details["tools/parse_errors"]) == (2, 1, 0)


def test_a_built_in_tools_schema_is_in_the_rendered_prompt():
    """--env calculator with a template that lists tools (Hermes' layout): the prompt holds
    get_json_schema(calculator)."""
    tok = load_tokenizer(TINY)
    tok.chat_template = HERMES
    environments = environment_for("calculator", Turns(), tok, True)
    [query] = encode_prompts(tok, [SUM], True, environments.tools)
    schema = json.dumps(get_json_schema(calculator))
    assert tok.decode(query) == f"<|system|>Tools: {schema}<eos><|user|>Add 4821+9377<eos><|assistant|>"


@pytest.mark.slow
@pytest.mark.parametrize("source,message", [
    ("def f(x: int) -> int:\n    '''No Args section.'''\n    return x\n",
     "tools: DocstringParsingException: Cannot generate JSON schema for f because the docstring has no description "
     "for the argument 'x'"),
    ("def f(x):\n    '''Untyped.\n\n    Args:\n        x: a value\n    '''\n",
     "tools: TypeHintParsingException: Argument x is missing a type hint in function f"),
    ("f = 'calculator'\n", r"tools is \('calculator',\): give a tuple of functions"),
], ids=["no-args", "untyped", "not-a-function"])
def test_a_bad_tool_fails_the_start_up_check_in_one_line_naming_the_file(tmp_path, source, message):
    from environments.worker import UserEnvironment
    path = tmp_path / "env.py"
    path.write_text(source + "class Env:\n    tools = (f,)\n    def __init__(self, problem): pass\n"
                    "    def step(self, turn): return None\n")
    env = UserEnvironment(f"{path}:Env", workers=1)
    try:
        with pytest.raises(DataError, match=f"^--env {re.escape(str(path))}:Env: {message}$"):
            env.check()
    finally:
        env.close()


@pytest.mark.slow
def test_a_users_subclass_of_a_built_in_tool_runs_in_its_worker_as_the_built_in_does(tmp_path):
    """A user's class that subclasses Calculator, in a worker: described with the calculator's schema, stop
    string, plain frame and done reason; a turn's two <calc> calls both run there and come back as two
    <result> frames (no chat template); a turn without a call ends the trace as stop/no_call, not done."""
    path = tmp_path / "calc.py"
    path.write_text("from environments.tools import Calculator\n\n\nclass MyCalc(Calculator):\n    pass\n")
    environments = environment_for(f"{path}:MyCalc", Turns(), load_tokenizer(TINY), chat_template=False, timeout=30)
    try:
        assert environments.tools == [get_json_schema(calculator)] and environments.stop_strings == ("</calc>",)
        session = environments(Problem("Add 1+1+4", "6"))
        ids = session.answer("<calc>1+1</calc> then <calc>2*3</calc>")
        assert load_tokenizer(TINY).decode(ids) == "<result>2</result><result>6</result>"
        session.seen()
        assert session.answer("<answer>6</answer>") is None and session.stop == "no_call"
        assert (session.details["tools/calls"], session.details["tools/correct"]) == (2, 1)
    finally:
        environments.pool.close()
