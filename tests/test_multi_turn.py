"""Multi-turn rollouts (environments/, environments/rollout.py, docs/math.md §8): observations are context,
never loss; every normaliser counts only the tokens the policy wrote; the built-in tools; the
engine writes what HF generate writes, turn after turn."""
import re
from contextlib import nullcontext
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

import algos
from config import Config
from environments import STOPS, Environment, Observations, Session, Step, Turns, environment_for, tool_frame
from environments.rollout import MultiTurn
from environments.tools import Calculator, PythonTool
from model import ResponseLogProbs, load_model, load_tokenizer
from rewards import Problem
from rollout import Chunk, Episode, Sampling, collate, generate
from helpers import PAD, frequent_token, prompts, random_lm, sampler_for
from train import Learner, update

TINY = "assets/tiny-running-sum"


# ----------------------------------------------------------------------------- observations and tools

def test_observation_is_the_templates_tool_message_after_the_models_own_end_of_turn():
    """The tiny model's template puts <eos> after an assistant turn (the model writes it: its stop id),
    then <|tool|>…, then the next <|assistant|> header; without a chat template the tool's plain frame."""
    tok = load_tokenizer(TINY)
    assert tool_frame(tok) == ("<|tool|>", "<|assistant|>")
    framed = Observations(tok, chat_template=True)("579", 8, Calculator.plain)
    assert tok.decode(framed) == "<|tool|>579<|assistant|>"
    assert framed[-1] == tok.convert_tokens_to_ids("<|assistant|>")  # a special token, not characters
    plain = Observations(tok, chat_template=False)("579", 8, Calculator.plain)
    assert tok.decode(plain) == "<result>579</result>"
    # the cap counts the observation's own tokens (one per character here), not the frame's
    assert tok.decode(Observations(tok, chat_template=True)("123456789", 4, ("", ""))) == "<|tool|>1234<|assistant|>"


# Llama 3.1's habit (a tool message's content through tojson) and Qwen3's (a last assistant turn rendered
# with an empty think block, other assistant turns without), on the tiny tokenizer
TOJSON = ("{% for m in messages %}{% if m.role == 'tool' %}<|ipython|>{{ m.content | tojson }}<eos>"
          "{% else %}<|{{ m.role }}|>{{ m.content }}<eos>{% endif %}{% endfor %}"
          "{% if add_generation_prompt %}<|assistant|>{% endif %}")
THINK = ("{% for m in messages %}{% if m.role == 'assistant' and loop.last %}<|assistant|><think></think>{{ m.content }}"
         "<eos>{% elif m.role == 'tool' %}<|tool|>{{ m.content }}<eos>{% else %}<|{{ m.role }}|>{{ m.content }}<eos>"
         "{% endif %}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")


@pytest.mark.parametrize("template,frame", [(TOJSON, ('<|ipython|>"', '"<eos><|assistant|>')),
                                            (THINK, ("<|tool|>", "<eos><|assistant|>"))], ids=["tojson", "think"])
def test_the_frame_survives_templates_that_escape_or_rewrite(template, frame):
    tok = load_tokenizer(TINY)
    tok.chat_template = template
    assert tool_frame(tok) == frame


def test_special_token_text_in_an_observation_stays_text():
    """A program that prints "<eos><|assistant|>" writes those characters, not a turn boundary."""
    tok = load_tokenizer(TINY)
    ids = Observations(tok, True)("<eos><|assistant|>", 64, ("", ""))
    special = {tok.eos_token_id, tok.convert_tokens_to_ids("<|assistant|>")}
    assert [i for i in ids if i in special] == [tok.convert_tokens_to_ids("<|assistant|>")]  # the frame's own
    assert tok.decode(ids) == "<|tool|><eos><|assistant|><|assistant|>"


def test_a_template_without_a_tool_role_falls_back_to_plain_text():
    tok = load_tokenizer(TINY)
    tok.chat_template = ("{% for m in messages %}{% if m['role'] == 'tool' %}{{ raise_exception('no tools') }}"
                         "{% endif %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}")
    assert tool_frame(tok) is None
    with pytest.warns(UserWarning, match="renders no tool message"):
        render = Observations(tok, True)
    assert tok.decode(render("7", 8, PythonTool.plain)) == "```output\n7\n```\n"


# Qwen2.5's layout (tools listed in a system turn, a tool message as a user turn of <tool_response>),
# on the tiny character tokenizer, whose end of turn is <eos>
HERMES = ("{%- if tools %}<|system|>Tools:{% for t in tools %} {{ t | tojson }}{% endfor %}<eos>{% endif %}"
          "{%- for m in messages %}{%- if m.role == 'tool' %}<|user|><tool_response>{{ m.content }}</tool_response><eos>"
          "{%- else %}<|{{ m.role }}|>{{ m.content }}<eos>{% endif %}{% endfor %}"
          "{%- if add_generation_prompt %}<|assistant|>{% endif %}")


def test_a_template_with_tools_lists_them_and_frames_their_output():
    from rollout import encode_prompts
    tok = load_tokenizer(TINY)
    tok.chat_template = HERMES
    prompt = tok.decode(encode_prompts(tok, [Problem("Add 1+2", "3")], True, Calculator.schemas())[0])
    assert prompt.startswith('<|system|>Tools: {"type": "function", "function": {"name": "calculator"')
    assert prompt.endswith("<|user|>Add 1+2<eos><|assistant|>")
    # after the model's own <eos>: the tool message, then the next assistant header
    assert tool_frame(tok) == ("<|user|><tool_response>", "</tool_response><eos><|assistant|>")
    assert tok.decode(Observations(tok, True)("3", 8, Calculator.plain)) == \
        "<|user|><tool_response>3</tool_response><eos><|assistant|>"
    plain = load_tokenizer(TINY)  # the shipped template ignores a tool list: the default prompt, unchanged
    assert encode_prompts(plain, [Problem("Add 1+2", "3")], True, Calculator.schemas()) == \
        encode_prompts(plain, [Problem("Add 1+2", "3")], True)


# Qwen2.5's template, its tool parts verbatim: tools listed in a system turn, a run of tool messages grouped
# into one user turn of <tool_response> blocks; on the tiny tokenizer with Qwen2.5's turn tokens added
QWEN25 = ("{%- if tools %}{{- '<|im_start|>system\\n# Tools\\n\\n<tools>' }}{%- for tool in tools %}{{- '\\n' }}"
          "{{- tool | tojson }}{%- endfor %}{{- '\\n</tools><|im_end|>\\n' }}{%- endif %}"
          "{%- for message in messages %}{%- if message.role == 'tool' %}"
          "{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != 'tool') %}"
          "{{- '<|im_start|>user' }}{%- endif %}"
          "{{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}"
          "{%- if loop.last or (messages[loop.index0 + 1].role != 'tool') %}{{- '<|im_end|>\\n' }}{%- endif %}"
          "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}"
          "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


def tokenizer_with(template: str):
    """The tiny tokenizer with `template`; Qwen2.5's turn tokens (one special id each, <|im_end|> the stop id)."""
    tok = load_tokenizer(TINY)
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = template
    if template == QWEN25:
        tok.stop_ids = [tok.convert_tokens_to_ids("<|im_end|>")]
    return tok


@pytest.mark.parametrize("template,frames", [
    (None, [("<|tool|>", "<|assistant|>"), ("<|tool|>", "<|tool|>", "<|assistant|>")]),  # the shipped one
    (HERMES, [("<|user|><tool_response>", "</tool_response><eos><|assistant|>"),
              ("<|user|><tool_response>", "</tool_response><eos><|user|><tool_response>",
               "</tool_response><eos><|assistant|>")]),
    (QWEN25, [("\n<|im_start|>user\n<tool_response>\n", "\n</tool_response><|im_end|>\n<|im_start|>assistant\n"),
              ("\n<|im_start|>user\n<tool_response>\n", "\n</tool_response>\n<tool_response>\n",
               "\n</tool_response><|im_end|>\n<|im_start|>assistant\n")]),
], ids=["tiny", "hermes", "qwen2.5"])
def test_several_tool_messages_are_framed_as_the_template_renders_them_in_a_row(template, frames):
    """tool_frame for n messages: the n + 1 pieces around them (Qwen2.5 groups a run of tool messages into one
    user turn, one <tool_response> each), and an observation of 1 to 3 messages renders exactly what
    apply_chat_template renders after the assistant's end of turn."""
    tok = tokenizer_with(template) if template else load_tokenizer(TINY)
    assert [tool_frame(tok, n) for n in (1, 2)] == frames
    render = Observations(tok, chat_template=True)
    for outputs in (["12"], ["12", "[3, 4]"], ["12", "error: division by zero", "5"]):
        chat = [{"role": "user", "content": "Add 4+8"}, {"role": "assistant", "content": "TURN"},
                *({"role": "tool", "content": output} for output in outputs)]
        full = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        after_turn = full[full.index("TURN") + len("TURN" + tok.decode(tok.stop_ids[:1])):]
        assert tok.decode(render(outputs, 64, Calculator.plain)) == after_turn
    assert set(render.frames) == {1, 2, 3}  # read once for each number of messages


def test_the_observation_cap_bounds_all_its_messages_together():
    """--max-observation-tokens counts the tokens of every message of an observation: the short ones
    whole, the long ones sharing what is left equally (environments.fair_cut); each still has its frame."""
    from environments import fair_cut
    assert [len(part) for part in fair_cut(["a" * 3, "b" * 50, "c" * 50], 20)] == [3, 8, 9]
    assert fair_cut(["x" * 50, "yy"], 20) == ["x" * 18, "yy"] and fair_cut(["abcdef"], 4) == ["abcd"]
    tok = load_tokenizer(TINY)
    ids = Observations(tok, chat_template=True)(["111", "2" * 50, "3" * 50], 20, Calculator.plain)
    assert tok.decode(ids) == "<|tool|>111<|tool|>" + "2" * 8 + "<|tool|>" + "3" * 9 + "<|assistant|>"


def test_a_template_that_renders_one_tool_message_but_not_several_gets_them_as_one():
    tok = load_tokenizer(TINY)
    tok.chat_template = ("{% for m in messages %}{% if m.role == 'tool' and loop.previtem.role == 'tool' %}"
                         "{{ raise_exception('one tool message at a time') }}{% endif %}<|{{ m.role }}|>{{ m.content }}"
                         "{% if m.role == 'assistant' %}<eos>{% endif %}{% endfor %}"
                         "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    assert tool_frame(tok, 2) is None
    assert tok.decode(Observations(tok, True)(["1/2", "20"], 16, Calculator.plain)) == "<|tool|>1/2\n\n20<|assistant|>"


@pytest.mark.parametrize("turn,expressions", [
    ('<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>', ["2+3"]),
    # every call of a turn runs, in the order written, whichever its form (once only the last ran)
    ('<calc>1+1</calc> <tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>',
     ["1+1", "2+3"]),
    ('<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call> <calc>1+1</calc>',
     ["2+3", "1+1"]),
    ('<tool_call>{"name": "python", "arguments": {"code": "print(1)"}}</tool_call>', []),  # another tool
    ('<tool_call>{"name": "calculator", "arguments": {"expression": 5}}</tool_call>', []),  # not text
    ('<tool_call>{"name": "calculator", "arguments": "2+3"}</tool_call>', []),
    ("<tool_call>{not json}</tool_call>", []),
    ("<tool_call>" + "[" * 100_000 + "</tool_call>", []),  # past the JSON parser's depth, or the length cap
    ('<tool_call>{"name": "calculator", "arguments": {"expression": "' + "1+" * 9000 + '1"}}</tool_call>', []),
])
def test_a_call_in_the_templates_tool_call_form(turn, expressions):
    calls, unread = Calculator(Problem("p", "5")).calls(turn)
    assert [arguments["expression"] for _, arguments in calls] == expressions and unread == int(not expressions)


@pytest.mark.parametrize("turn,programs", [
    ("```py\n  print(5)\n```", ["print(5)\n"]),  # a response's program as code problems read it: ```py, dedented
    ("```python\nprint(1)\n```\n```python\nprint(2)", ["print(1)\n"]),  # an unclosed block is no call
    # every block and call of a turn runs, in the order written (once only the last ran)
    ('```python\nprint(1)\n```\n<tool_call>{"name": "python", "arguments": {"code": "print(2)"}}</tool_call>',
     ["print(1)\n", "print(2)"]),
    ('<tool_call>{"name": "python", "arguments": {"code": "print(2)"}}</tool_call>\n```python\nprint(1)\n```',
     ["print(2)", "print(1)\n"]),
    ("```python\nprint(1)\n```\ntext\n```python\nprint(2)\n```", ["print(1)\n", "print(2)\n"]),
])
def test_python_tool_reads_every_block_and_call(turn, programs):
    assert [arguments["code"] for _, arguments in PythonTool(Problem("p", "1")).calls(turn)[0]] == programs


def test_python_tool_call_in_the_templates_form():
    step = PythonTool(Problem("p", "3")).step('<tool_call>{"name": "python", "arguments": {"code": "print(1 + 2)"}}'
                                              '</tool_call>')
    assert step.observation == ["3\n"] and step.details["tools/correct"] == 1


@pytest.mark.parametrize("turn,outputs,failed", [
    ("so <calc>4821+9377</calc>", ["14198"], 0),
    # every call runs, in order, one message each (once only the last ran: ["20"])
    ("<calc>1/3+1/6</calc> then <calc>(2+3)*4</calc>", ["1/2", "20"], 0),
    ("<calc>1/3 + 1/6</calc>", ["1/2"], 0),  # exact rationals
    ("<calc>1/0</calc>", ["error: division by zero"], 1),
    ("<calc>__import__('os')</calc>", None, 1),  # never Python's eval
    ("<calc>" + "9" * 300 + "</calc>", ["error: longer than 200 characters"], 1),
    ("<calc>" + "(" * 150 + "1" + ")" * 150 + "</calc>", None, 1),  # too deep for the bounded parser
    ("<calc>4821+9377</calc> <calc>1/0</calc> <calc>14198</calc>", ["14198", "error: division by zero", "14198"], 1),
])
def test_calculator_is_exact_and_bounded(turn, outputs, failed):
    step = Calculator(Problem("p", "14198")).step(turn)
    assert step.details["tools/calls"] == len(step.observation) and step.details["tools/errors"] == failed
    assert step.details["tools/correct"] == (outputs or []).count("14198")
    if outputs is not None:
        assert step.observation == outputs
    assert failed == sum(output.startswith("error:") for output in step.observation)


def test_a_turn_without_a_call_ends_the_trace():
    """Done (no observation, the task grades), with the <tool_call> bodies it could not read counted."""
    assert Calculator(Problem("p", "3")).step("<answer>3</answer>") == Step(details={"tools/parse_errors": 0})
    assert PythonTool(Problem("p", "3")).step("print(3) outside a fence") == Step(details={"tools/parse_errors": 0})
    broken = '<tool_call>{"name": "calculator", "arguments": </tool_call> <tool_call>{"name": "other"}</tool_call>'
    assert Calculator(Problem("p", "3")).step(broken) == Step(details={"tools/parse_errors": 2})


def test_python_tool_runs_the_block_in_the_sandbox():
    env = PythonTool(Problem("p", "42"))
    step = env.step("Let me compute.\n```python\nprint(6 * 7)\n```")
    assert step.observation == ["42\n"] and step.details == {"tools/calls": 1, "tools/errors": 0, "tools/correct": 1,
                                                           "tools/parse_errors": 0}
    crashed = env.step("```python\nprint(1)\nraise ValueError('bad')\n```")
    assert crashed.observation[0].startswith("1\n") and "ValueError: bad" in crashed.observation[0]
    assert crashed.details["tools/errors"] == 1
    # limits the program meets as exceptions come back as its error, counted: memory, processes
    greedy = env.step("```python\nx = 'x' * (1 << 40)\n```")
    assert greedy.observation == ["MemoryError"] and greedy.details["tools/errors"] == 1
    # (a fork bomb's copies all fail, and their tracebacks interleave on stderr: its last line varies)
    bomb = env.step("```python\nimport os\nwhile True: os.fork()\n```")
    assert bomb.observation and bomb.details["tools/errors"] == 1


@pytest.mark.parametrize("program", [
    "while True: pass",  # past the wall-clock limit
    "while True: print('x' * 65536)",  # past the output cap
])
@pytest.mark.slow
def test_hostile_tool_code_ends_the_trace_with_reward_0_counted(program, monkeypatch):
    monkeypatch.setattr(PythonTool, "box", None)  # the process's sandbox, as it was, after the test
    PythonTool.prepare(timeout=1.0)  # the endless loop waits out 1 s, not the default 5
    tok = load_tokenizer(TINY)
    session = Session(PythonTool(Problem("p", "1")), Observations(tok, True), 32)
    assert session.answer(f"```python\n{program}\n```") is None
    assert session.reward == 0.0 and session.details["env/failures"] == 1


class Hostile(Environment):
    def __init__(self, problem, answer):
        super().__init__(problem)
        self.answer = answer

    def step(self, turn):
        return self.answer()


def boom():
    raise RuntimeError("environment bug")


@pytest.mark.parametrize("answer", [boom, lambda: "text, not a Step", lambda: Step(observation=b"bytes"),
                                    lambda: Step(observation=None, reward=float("nan")),
                                    lambda: Step(observation=None, reward="1"), lambda: Step("x", details={"a": "b"}),
                                    lambda: Step("x", details={"env/failures": -5}), lambda: Step("x\ud800"),
                                    lambda: Step([]), lambda: Step(["x", 5]), lambda: Step(["x"] * 17)],
                         ids=["raises", "not-a-step", "bytes", "nan-reward", "text-reward", "text-detail",
                              "rollout-metric", "lone-surrogate", "no-message", "not-text-message", "17-messages"])
def test_a_failing_environment_ends_its_trace_with_reward_0_counted(answer):
    session = Session(Hostile(Problem("p", "1"), answer), Observations(load_tokenizer(TINY), True), 32)
    assert session.answer("anything") is None
    assert session.reward == 0.0 and session.details["env/failures"] == 1


def test_megabytes_of_observation_are_cut_before_tokenising():
    tok = load_tokenizer(TINY)
    session = Session(Hostile(Problem("p", "1"), lambda: Step("7" * (8 << 20))), Observations(tok, True), 32)
    ids = session.answer("go")
    assert tok.decode(ids) == "<|tool|>" + "7" * 32 + "<|assistant|>"
    assert session.details["length/observation"] == 0  # until the observation reaches the model
    session.seen()
    assert session.details["length/observation"] == len(ids)


def test_an_unknown_env_is_named():
    with pytest.raises(ValueError, match="calculator, python or path/to/file.py:Class"):
        environment_for("abacus", Turns(), load_tokenizer(TINY), True)


# ----------------------------------------------------------------------------- the rollout loop

class Scripted:
    """A session answering each turn with the next observation ids, then done (None)."""

    def __init__(self, observations, reward=None):
        self.observations, self.reward, self.cut = list(observations), reward, False
        self.details, self.asked, self.stop, self.error = {"tools/calls": 0}, [], "", ""
        self.turn_rewards = []  # no turn rewards: settle_trace gives each turn 0, as a Session without any

    def answer(self, turn):
        self.asked.append(turn)
        if not self.observations:
            self.stop = "done"
            return None
        return self.observations.pop(0)

    def seen(self):
        self.details["tools/calls"] += 1


def fake_tokenizer(eos):
    return SimpleNamespace(eos_token_id=eos, pad_token_id=PAD, decode=lambda ids, **_: " ".join(map(str, ids)))


def test_each_turn_is_a_row_whose_prompt_holds_every_earlier_turn_and_observation(monkeypatch):
    """Turn rows as environments.rollout.interact writes them, with `sample` scripted: q [1, 2]; turn 1 [7, eos],
    observation [5, 6]; turn 2 [8, eos] -> rows ([1, 2] -> [7, eos]), ([1, 2, 7, eos, 5, 6] -> [8, eos]);
    the response is only what the model wrote; the grader reads the last turn."""
    import rollout
    eos = 3
    turns = iter([[([7, eos], [-0.1, -0.2]), ([9, 9, eos], [-0.3, -0.4, -0.5])], [([8, eos], [-0.6, -0.7])]])
    monkeypatch.setattr(rollout, "sample", lambda lm, tok, rows, sampling, **_: next(turns)[:len(rows)])
    sessions = [Scripted([[5, 6]]), Scripted([])]
    episodes = generate(None, fake_tokenizer(eos), [Problem("p", "1")], [[1, 2]], group_size=2,
                        sampling=Sampling(max_new_tokens=4),
                        shape=MultiTurn(lambda p: sessions.pop(0), Turns(max_turns=3)))
    a, b = episodes
    assert [(c.prompt_ids, c.response_ids, c.sampler_logp) for c in a.chunks] == [
        ([1, 2], [7, eos], [-0.1, -0.2]), ([1, 2, 7, eos, 5, 6], [8, eos], [-0.6, -0.7])]
    assert a.response_ids == [7, eos, 8, eos] and a.text == f"8 {eos}" and not a.truncated
    stops = {f"stop/{s}": float(s == "done") for s in STOPS}  # both traces: the environment said done
    assert a.transcript == f"7 {eos} 5 6 8 {eos}" and \
        a.details == {"tools/calls": 1, "turns/mean": 2, "turns/reward": 0.0, **stops}
    assert [c.response_ids for c in b.chunks] == [[9, 9, eos]] and b.details["turns/mean"] == 1


MODEL_OF_12 = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=12))  # what interact reads of a model


@pytest.mark.parametrize("caps,model,turns_written,stop", [(Turns(max_turns=2), None, 2, "max_turns"),
                                                           (Turns(max_turns=5, max_tokens=12), None, 2, "context"),
                                                           (Turns(max_turns=5), MODEL_OF_12, 2, "context")],
                         ids=["turns", "trace-tokens", "model-context"])
def test_caps_end_a_trace_as_truncated(monkeypatch, caps, model, turns_written, stop):
    """An environment that always answers: the turn cap, the context cap, or the model's context stops
    the trace, truncated, and its stop reason says which."""
    import rollout
    eos = 3
    monkeypatch.setattr(rollout, "sample", lambda lm, tok, rows, sampling, **_: [([7, eos], [0.0, 0.0])] * len(rows))
    episodes = generate(model, fake_tokenizer(eos), [Problem("p", "1")], [[1, 2]], group_size=1,
                        sampling=Sampling(max_new_tokens=4),
                        shape=MultiTurn(lambda p: Scripted([[5, 6, 6]] * 9), caps))
    # contexts: 2, then 2 + 2 + 3 = 7 (7 + 4 ≤ 12: a 2nd turn), then 7 + 5 = 12 (12 + 4 > 12: cut)
    assert len(episodes[0].chunks) == turns_written and episodes[0].truncated
    assert [k for k, v in episodes[0].details.items() if k.startswith("stop/") and v] == [f"stop/{stop}"]


def test_a_call_whose_answer_the_caps_cut_off_counts_nothing(monkeypatch):
    """Every turn calls the calculator; with 2 turns at most, the second call's value never reaches the
    model: one call, one observation counted, and the trace is truncated."""
    import rollout
    tok = load_tokenizer(TINY)
    call = tok("<calc>1+1</calc>", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    monkeypatch.setattr(rollout, "sample", lambda lm, t, rows, sampling, **_: [(call, [0.0] * len(call))] * len(rows))
    environment = environment_for("calculator", Turns(max_turns=2), tok, True)
    [e] = generate(None, tok, [Problem("p", "2")], [[5, 6]], group_size=1, sampling=Sampling(max_new_tokens=32),
                   shape=MultiTurn(environment, Turns(max_turns=2)))
    observation = len(e.chunks[1].prompt_ids) - len(e.chunks[0].prompt_ids) - len(call)
    assert len(e.chunks) == 2 and e.truncated and e.text == "<calc>1+1</calc>"
    assert e.details["tools/calls"] == 1 == e.details["tools/correct"]
    assert e.details["length/observation"] == observation == len("<|tool|>2") + 1


def test_a_turn_cut_by_max_new_tokens_ends_the_trace_without_asking_the_environment(monkeypatch):
    import rollout
    monkeypatch.setattr(rollout, "sample", lambda lm, tok, rows, sampling, **_: [([7, 7], [0.0, 0.0])] * len(rows))
    session = Scripted([[5]])
    [e] = generate(None, fake_tokenizer(3), [Problem("p", "1")], [[1, 2]], group_size=1,
                   sampling=Sampling(max_new_tokens=2), shape=MultiTurn(lambda p: session, Turns()))
    assert len(e.chunks) == 1 and e.truncated and session.asked == [] and e.details["stop/length"] == 1


def test_the_environments_reward_replaces_the_graders():
    from rewards import Verdict
    e = Episode([1], [2], "t", False, 0, Problem("p", "1"), details={"tools/calls": 1})
    e.settle(Verdict(1.0, "1", details={"code/x": 0.5}))
    assert e.reward == 1.0 and e.details == {"tools/calls": 1, "code/x": 0.5}
    e.env_reward = 0.25
    e.settle(Verdict(1.0, "1", failure="timeout"))
    assert e.reward == 0.25 and e.grader_failed


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.slow
def test_greedy_multi_turn_traces_equal_between_the_engine_and_hf_generate(arch):
    """Random models; a frequent token as EOS, so that turns end at different steps; every trace gets
    two observations of different lengths, so the third turn's contexts are ragged."""
    lm = random_lm(arch)
    queries = prompts([3, 9, 5, 7])
    greedy = Sampling(temperature=0, max_new_tokens=10, sampler=sampler_for("fast"))
    from rollout import sample
    eos = frequent_token([t for t, _ in sample(lm, fake_tokenizer(10_000), queries, replace(greedy, max_new_tokens=24))])
    problems = [Problem(str(i), "0") for i in range(len(queries))]

    def run(engine):
        made = iter(range(100))
        return generate(lm, fake_tokenizer(eos), problems, queries, group_size=1,
                        sampling=replace(greedy, sampler=sampler_for(engine)),
                        shape=MultiTurn(lambda p: Scripted([[11] * (1 + next(made) % 3), [12, 13]]),
                                        Turns(max_turns=3)))

    hf, fast = run("hf"), run("fast")
    assert [[(c.prompt_ids, c.response_ids) for c in e.chunks] for e in fast] == \
        [[(c.prompt_ids, c.response_ids) for c in e.chunks] for e in hf]
    assert sum(len(e.chunks) for e in hf) > len(hf)  # some traces went on past their first turn
    for e_fast, e_hf in zip(fast, hf):
        for a, b in zip(e_fast.chunks, e_hf.chunks):
            assert a.sampler_logp == pytest.approx(b.sampler_logp, abs=1e-4)


# ----------------------------------------------------------------------------- training on turns

def trace(query, turns, observations, reward, group):
    """An Episode of turns written as environments.rollout.interact writes them (each row's prompt: all before it)."""
    chunks, context = [], list(query)
    for i, turn in enumerate(turns):
        chunks.append(Chunk(list(context), list(turn)))
        context += turn + (observations[i] if i < len(observations) else [])
    return Episode(prompt_ids=list(query), response_ids=[t for turn in turns for t in turn], text="",
                   truncated=False, group=group, problem=Problem("p", "0"), reward=reward, score=reward,
                   chunks=chunks)


def traces():
    """Two groups of two traces: 2 turns (3 + 2 tokens, 4 observation tokens between) vs 1 turn of 4;
    3 turns (2 + 1 + 3) vs 2 turns (1 + 2). Rewards 1, 0 | 0, 1. Token 1 is the tiny model's <eos>."""
    q1, q2 = [40, 41, 42, 43, 44], [50, 51, 52]
    return [trace(q1, [[60, 61, 1], [62, 1]], [[70, 71, 72, 73]], 1.0, 0),
            trace(q1, [[63, 64, 65, 1]], [], 0.0, 0),
            trace(q2, [[66, 1], [1], [67, 68, 1]], [[74, 75], [76, 77, 78]], 0.0, 1),
            trace(q2, [[69, 1], [80, 1]], [[81]], 1.0, 1)]


def one_row(e: Episode):
    """The trace as one row: its query, then everything after (turns and observations), masked to
    the written tokens: the single-row form of verl's multi-turn loss mask, an independent layout."""
    last = e.chunks[-1]
    rest = last.prompt_ids[len(e.prompt_ids):] + last.response_ids
    written = set()
    pos = 0
    for c in e.chunks:
        start = len(c.prompt_ids) - len(e.prompt_ids)
        written.update(range(start, start + len(c.response_ids)))
        pos = start + len(c.response_ids)
    assert pos == len(rest)
    return Chunk(e.prompt_ids, rest), [float(i in written) for i in range(len(rest))]


# name, Config overrides, per-trace weight on Σ −A·logp over its written tokens (L: a trace's written
# tokens, n traces, budget max_turns × max_new_tokens = 3 × 8 = 24)
NORMALISERS = [
    ("grpo", {}, lambda lengths: [1 / (len(lengths) * n) for n in lengths]),  # seq-mean-token-mean
    ("dapo", {}, lambda lengths: [1 / sum(lengths)] * len(lengths)),  # token-mean over the mini-batch
    ("dr_grpo", {}, lambda lengths: [1 / (len(lengths) * 24)] * len(lengths)),  # a constant: traces × budget
    ("cispo", {}, lambda lengths: [1 / sum(lengths)] * len(lengths)),  # token-mean, sg(clipped ratio) = 1 on-policy
]


@pytest.mark.parametrize("algo,over,weights", NORMALISERS, ids=[n[0] for n in NORMALISERS])
@pytest.mark.slow
def test_turn_rows_give_the_gradient_of_the_masked_trace(algo, over, weights):
    """One on-policy step (SGD, lr 1: the change is minus the gradient) on turn rows equals the
    hand-written loss on each trace as one row, observations masked out: Σ_τ w_τ Σ_t∈written −A_τ logp_t,
    with w_τ the algorithm's normaliser over written tokens only (5, 4, 6, 4 here, not 9, 4, 11, 5)."""
    cfg = replace(Config(algo=algo, group_size=2, prompts_per_step=2, max_new_tokens=8, env="calculator",
                         max_turns=3, grad_clip=0.0), **{**algos.get(algo).preset, **over, "dynamic_sampling": False,
                                                         "overlong_penalty": False, "mini_batches": 1, "epochs": 1})
    episodes = traces()
    lm = load_model(TINY)
    start = {k: v.clone() for k, v in lm.state_dict().items()}
    opt = torch.optim.SGD(lm.parameters(), lr=1.0)
    learner = Learner(scorer=ResponseLogProbs(lm), lm=lm, ref_scorer=None, optimizer=opt,
                      scheduler=torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0), algo=algos.get(algo), cfg=cfg,
                      autocast=nullcontext, pad_id=0, rank=0, world=1, device=torch.device("cpu"))
    update(learner, episodes)
    got = {k: start[k] - v for k, v in lm.state_dict().items()}  # the gradient

    lengths = [len(e.response_ids) for e in episodes]
    assert lengths == [5, 4, 6, 4]
    if algo in ("grpo", "dapo", "cispo"):  # group-normalised: rewards (1, 0) -> ±1/√2 (unbiased std)
        assert [e.advantage for e in episodes] == pytest.approx([0.70710678, -0.70710678, -0.70710678, 0.70710678],
                                                                abs=1e-5)
    ref = load_model(TINY)
    rows, masks = zip(*map(one_row, episodes))
    batch = collate(list(rows), 0, "cpu")
    mask = torch.zeros_like(batch.response_mask)
    for i, m in enumerate(masks):
        mask[i, :len(m)] = torch.tensor(m)
    assert mask.sum() == sum(lengths) < batch.response_mask.sum()  # observations are in the row, not the mask
    logp = ResponseLogProbs(ref)(batch.input_ids, batch.attention_mask, batch.position_ids, batch.response_mask,
                                 cfg.temperature)["logp"]
    w = torch.tensor(weights(lengths)) * torch.tensor([e.advantage for e in episodes])
    (-(w[:, None] * mask * logp).sum()).backward()
    for name, p in ref.named_parameters():
        assert torch.allclose(got[name], p.grad, atol=1e-6), name


@pytest.mark.slow
def test_no_observation_token_receives_gradient():
    """The gradient of one update with respect to the final hidden state of every position (the
    logits there are a function of it alone): zero at each position that predicts an observation
    token (or the query), nonzero at some position of every turn."""
    cfg = Config(algo="grpo", group_size=2, prompts_per_step=2, max_new_tokens=8, env="calculator", max_turns=3)
    episodes = traces()
    lm = load_model(TINY)
    grads = []
    lm.model.norm.register_full_backward_hook(lambda module, grad_in, grad_out: grads.append(grad_out[0].clone()))
    opt = torch.optim.SGD(lm.parameters(), lr=0.0)
    learner = Learner(scorer=ResponseLogProbs(lm), lm=lm, ref_scorer=None, optimizer=opt,
                      scheduler=torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0), algo=algos.get("grpo"), cfg=cfg,
                      autocast=nullcontext, pad_id=0, rank=0, world=1, device=torch.device("cpu"))
    update(learner, episodes)
    rows = [c for e in episodes for c in e.rows()]
    batch = collate(rows, 0, "cpu")
    grad = torch.cat(grads).abs().sum(-1)  # [rows, P + Tr]: |∂loss/∂hidden| at each position
    assert grad.shape[0] == len(rows)
    p = batch.input_ids.shape[1] - batch.response_mask.shape[1]
    for i, c in enumerate(rows):
        # logits at column j predict token j + 1: the written tokens are columns p - 1 ... p + len - 2
        written = set(range(p - 1, p - 1 + len(c.response_ids)))
        for j in range(grad.shape[1]):
            if j not in written:
                assert grad[i, j] == 0, (i, j)
        assert grad[i, sorted(written)].sum() > 0


# ----------------------------------------------------------------------------- whole runs

SMALL = ["--prompts-per-step", "4", "--group-size", "2", "--max-new-tokens", "48", "--sum-min-terms", "2",
         "--sum-max-terms", "3", "--eval-every", "0", "--log-samples", "8"]


@pytest.mark.slow
def test_a_hostile_user_environment_scores_0_counted_and_the_run_goes_on(tmp_path):
    """tests/fixtures/hostile_env.py raises, hangs past --env-timeout, returns megabytes or a number,
    or ends the trace, by problem: 2 steps of 8 traces finish, the failures scored 0 and counted."""
    import json

    import train
    out = tmp_path / "run"
    train.main([*SMALL, "--max-steps", "2", "--env", "tests/fixtures/hostile_env.py:Hostile", "--env-timeout", "1",
                "--max-observation-tokens", "8", "--out", str(out)])
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert sum(r["env/failures"] for r in rows) > 0 and all(r["reward/mean"] < 1 for r in rows)
    samples = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    for s in samples:  # a failed kind scores 0; a megabyte observation reaches the model as 8 tokens
        kind = int(s["gold"]) % 5
        if kind in (0, 1, 3):
            assert s["reward"] == 0.0
        if kind == 2 and "<|tool|>" in s["transcript"]:
            assert "<|tool|>" + "7" * 8 + "<|assistant|>" in s["transcript"]



@pytest.mark.slow
@pytest.mark.extended  # two runs of 4 steps, one in a process of its own killed and resumed
def test_kill_9_and_resume_replays_a_multi_turn_run_exactly(tmp_path):
    """examples/env_retry.py (a wrong answer is told so, and the model tries again) in a user
    environment's worker: a run SIGKILLed once step-2 is saved, then resumed, logs what an
    uninterrupted run logs, multi-turn traces and all, and ends with the same weights."""
    import json

    import train
    from helpers import kill_9, metrics, same_run, start_train, wait_until
    from test_faults import complete, equal, weights
    args = [*SMALL, "--max-steps", "4", "--save-every", "1", "--env", "examples/env_retry.py:Retry", "--max-turns", "3"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the killed run's process, so that the numbers agree bit for bit
    try:
        reference = tmp_path / "reference"
        train.main([*args, "--out", str(reference)])
        run = tmp_path / "run"
        proc = start_train(args, run)
        try:
            wait_until(proc, lambda: "step-2" in complete(run) if (run / "checkpoints").is_dir() else False, "step-2")
        finally:
            kill_9(proc)
        assert "step-4" not in complete(run)
        train.main(["--resume", str(run)])
    finally:
        torch.set_num_threads(threads)
    rows = metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and same_run(metrics(reference), rows)
    assert max(r["turns/mean"] for r in rows) > 1  # some traces did take several turns
    assert (run / "samples.jsonl").read_text() == (reference / "samples.jsonl").read_text()
    assert any(len(json.loads(x).get("transcript", "")) > 0 for x in (run / "samples.jsonl").read_text().splitlines())
    assert equal(weights(run / "checkpoints" / "step-4"), weights(reference / "checkpoints" / "step-4"))


def test_the_memory_plan_prompts_a_last_turn_with_every_earlier_turn_and_observation():
    """rollout.prompt_tokens: P + (T − 1)(C + O + 16), capped by max_trace_tokens − C; the update's rows
    are that long, max_turns of them a trace."""
    from extras.plan import micro_batch, target_for
    from rollout import prompt_tokens
    cfg = Config(plan_prompt_tokens=512, max_new_tokens=256, max_observation_tokens=256, micro_batch_size=10_000)
    assert prompt_tokens(cfg) == 512
    turned = replace(cfg, env="python", max_turns=3)
    assert prompt_tokens(turned) == 512 + 2 * (256 + 256 + 16) == 1568
    assert prompt_tokens(replace(turned, max_trace_tokens=1024)) == 1024 - 256
    assert prompt_tokens(replace(turned, max_trace_tokens=600)) == 512  # never below the query
    t = target_for(turned, 1, "cuda")
    (rows, length, _), (plain_rows, plain_length, _) = micro_batch(turned, t), micro_batch(cfg, t)
    assert length == 1568 + 256 and plain_length == 512 + 256 and rows == 3 * plain_rows


@pytest.mark.parametrize("flags,message", [
    (["--algo", "pacs"], "with --env a response is split over several rows, which it does not support: drop --env"),
    (["--algo", "gspo"], "which a Markovian or multi-turn trace split over rows does not have in one row"),
    (["--max-chunks", "3"], "--env writes multi-turn traces and max_chunks > 1 Markovian ones"),
    (["--max-trace-tokens", "40"], "max_trace_tokens=40 leaves no room for a turn of max_new_tokens=80"),
    (["--max-turns", "0"], "max_turns=0: must be ≥ 1"),
])
def test_what_cannot_run_on_multi_turn_traces_is_named(flags, message):
    """PACS and GSPO score a whole response in one row, which a trace of several turns is not."""
    import config
    with pytest.raises(ValueError, match=re.escape(message)):
        config.validate(config.parse_config(["--env", "calculator", *flags]), 1)


def test_env_python_reads_the_sandbox_knobs():
    """--sandbox-timeout is a code file's knob, and --env python's: its programs run in the sandbox too."""
    import config
    import data
    data.load(config.parse_config(["--env", "python", "--sandbox-timeout", "2"]))
    with pytest.raises(ValueError, match="sandbox_timeout=2.0: no source of --data running_sum is a file of code"):
        data.load(config.parse_config(["--sandbox-timeout", "2"]))
    try:
        env = environment_for("python", Turns(), load_tokenizer(TINY), True, sandbox=("auto", 2.0, 256))
        assert PythonTool.box.limits.timeout == 2.0 and PythonTool.box.limits.memory == 256 << 20
        assert env.tools == PythonTool.schemas()
    finally:
        PythonTool.box = None  # the process's sandbox: the next PythonTool makes the default one


def test_an_environment_failing_every_trace_stops_the_run_quoting_its_first_error():
    """MultiTurn.check after each training step: with give_up (1.0, 1) a step whose traces all failed
    stops the run, quoting the first failure's words; with (0.5, 2) it takes two steps in a row with
    at least half failed, and a sound step between resets the count; steps 0 never stops."""
    from rollout import Episode, RolloutError

    def step(failed: int, of: int = 4) -> list:
        return [Episode([1], [2], "", False, 0, Problem("p", ""), details={"env/failures": float(i < failed)},
                        env_error="ValueError: the tool server is down" if i < failed else "") for i in range(of)]

    shape = MultiTurn(lambda p: None, Turns())
    shape.check(step(3))  # 3 of 4: goes on
    with pytest.raises(RolloutError) as e:
        shape.check(step(4))
    assert str(e.value) == ("the environment failed 4 of 4 traces (--env-fail-fraction 1, --env-fail-steps 1); "
                            "the first: ValueError: the tool server is down")
    patient = MultiTurn(lambda p: None, Turns(), give_up=(0.5, 2))
    for failed in (2, 0, 4):
        patient.check(step(failed))
    with pytest.raises(RolloutError, match="in each of 2 steps in a row"):
        patient.check(step(2))
    never = MultiTurn(lambda p: None, Turns(), give_up=(1.0, 0))
    for _ in range(3):
        never.check(step(4))


# ============================================================================ stop strings

class Spaced:
    """A tokenizer stand-in whose text is the ids with spaces: [12, 7] -> "12 7"."""
    pad_token_id = PAD

    def __init__(self, eos):
        self.eos_token_id = eos

    def decode(self, ids, **_):
        return " ".join(map(str, ids))


def test_a_stop_string_ends_a_response_where_it_first_appears():
    from rollout import StopStrings, cut_at_stop, ends
    strings = StopStrings(Spaced(3), ["4 5"])
    assert strings.end([1, 4, 5, 4, 5]) == 3 and strings.end([1, 4, 6]) is None
    assert strings.end([14, 5]) == 2  # as text: "14 5" holds "4 5"
    assert cut_at_stop([1, 4, 5, 9, 3], [3], 8, strings) == [1, 4, 5]  # the string first
    assert cut_at_stop([1, 3, 4, 5], [3], 8, strings) == [1, 3]  # the stop id first
    assert ends([1, 4, 5], [3], strings) and not ends([4, 5, 1], [3], strings) and ends([7, 3], [3])


class Scripts:
    """Sessions (Scripted) that answer every turn with [5, 6] until the 3rd, with a stop string."""

    def __init__(self, stop: str):
        self.stop_strings = (stop,)

    def __call__(self, problem):
        return Scripted([[5, 6], [5, 6]])


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_greedy_multi_turn_traces_with_a_stop_string_are_equal_in_both_engines(arch):
    """A stop string two tokens long, taken from what the model writes greedily mid-turn: both engines
    cut the turns where it first completes (kept in the turn), ask the environment, and write the same
    traces token for token; turns it cut are shorter than the budget and count as ended."""
    lm = random_lm(arch)
    rows = [p for p in prompts([3, 9, 5, 7]) for _ in range(2)]
    greedy = Sampling(temperature=0, max_new_tokens=24, sampler=sampler_for())
    from rollout import sample
    first = sample(lm, Spaced(10_000), rows, greedy)[0][0]
    stop = f"{first[4]} {first[5]}"
    traces = {}
    for engine in ("hf", "fast"):
        traces[engine] = generate(lm, Spaced(10_000), [Problem("p", "1")] * 4, rows[::2], group_size=2,
                                  sampling=replace(greedy, sampler=sampler_for(engine)),
                                  shape=MultiTurn(Scripts(stop), Turns(3)))
    assert [[(c.prompt_ids, c.response_ids) for c in e.chunks] for e in traces["fast"]] == \
        [[(c.prompt_ids, c.response_ids) for c in e.chunks] for e in traces["hf"]]
    cut = [c.response_ids for e in traces["hf"] for c in e.chunks if len(c.response_ids) < 24]
    assert cut and all(" ".join(map(str, r)).endswith(stop.split()[-1]) and stop in " ".join(map(str, r))
                       for r in cut)
    assert any(len(e.chunks) > 1 for e in traces["hf"])  # a cut turn was asked, and answered


def test_a_plain_frame_does_not_repeat_the_stop_string_the_turn_wrote():
    """Qwen2.5-Math's format without a chat template: the turn stops at "```output" (kept), so the
    observation starts after it: "\\n42\\n```\\n", not "```output\\n42\\n```\\n" again. Several
    outputs follow one another, each in its frame; only the first's start is the turn's."""
    tok = load_tokenizer(TINY)
    render = Observations(tok, chat_template=False)
    ids = render("42", 16, PythonTool.plain, turn="```python\nprint(42)\n```\n```output")
    assert tok.decode(ids) == "\n42\n```\n"
    ids = render(["1", "2"], 16, PythonTool.plain, turn="```python\nprint(1)\n```\n```output")
    assert tok.decode(ids) == "\n1\n```\n```output\n2\n```\n"
    assert tok.decode(render(["1", "2"], 16, Calculator.plain)) == "<result>1</result><result>2</result>"
    assert tok.decode(render("42", 16, PythonTool.plain, turn="no fence")) == "```output\n42\n```\n"
    environments = environment_for("python", Turns(), tok, chat_template=False)
    assert environments.stop_strings == ("```output",)
    assert environment_for("python", Turns(), tok, chat_template=True).stop_strings == ()  # its tool role frames calls
