"""Code problems as a task (grading.code.CodeTask): a data file whose rows have tests, its prompt recipes,
its knobs, and `eval.py --responses`, which grades given responses with no model loaded.

The sandbox and the grader themselves are tests/test_sandbox.py's; here they run in the
strongest isolation this machine has (isolation "auto").
"""
import json
from pathlib import Path

import pytest

import config
import data
import eval as evaluation
import model
from grading.code import CodeTask
from data import make_task
from rewards import DataError, Problem, Verdict
from grading.files import is_code_file
from grading.code import CODE_TEMPLATES, code_prompt
from helpers import fenced, fixture_problems

FIXTURE = Path(__file__).parent / "fixtures" / "code_problems.jsonl"  # right and wrong programs for each problem
PASSED = {"code/tests_passed": 1.0, "code/no_program": 0.0, "code/timeout": 0.0, "code/crash": 0.0,
          "code/output_limit": 0.0}


@pytest.fixture(scope="module")
def task():
    return make_task(str(FIXTURE))


def test_a_file_whose_rows_have_tests_is_graded_by_running_them(task):
    problems = fixture_problems()
    assert isinstance(task, CodeTask) and task.splits()[1] == []
    assert [p.answer for p in task.problems] == [f"{FIXTURE}:{i}" for i in range(1, 6)]  # the row, not its tests
    assert [p.prompt for p in task.problems] == [p["prompt"] for p in problems]  # no recipe: as written
    items = [(prob, fenced(row[kind])) for prob, row in zip(task.problems, problems) for kind in ("right", "wrong")]
    verdicts = task.grade_batch(items + [(task.problems[0], "the answer is 3"),
                                         (task.problems[0], fenced("print(1 / 0)")),
                                         (Problem("from elsewhere", "other.jsonl:1"), fenced("print(3)"))], 0.0)
    for row, right, wrong in zip(problems, verdicts[0:10:2], verdicts[1:10:2]):
        assert right == Verdict(1.0, row["right"].strip(), "", PASSED), row["name"]
        assert (wrong.reward, wrong.failure) == (0.0, "") and wrong.answer == row["wrong"].strip()  # maj@n votes on it
        assert wrong.details["code/tests_passed"] == row["wrong_passes"] / len(row["tests"]["inputs"]), row["name"]
    no_code, crash, unknown = verdicts[10:]
    assert no_code == Verdict(0.0, None, "", {**PASSED, "code/tests_passed": 0.0, "code/no_program": 1.0})
    # a program's crash is its wrong answer, not a grader failure (reward/grader_failures)
    assert crash == Verdict(0.0, "print(1 / 0)", "", {**PASSED, "code/tests_passed": 0.0, "code/crash": 1.0})
    assert unknown == Verdict(0.0, failure="error")


def test_a_weaker_sandbox_is_said_at_the_start():
    assert "no Linux namespaces" in CodeTask(str(FIXTURE), isolation="none").warnings[0]
    with pytest.raises(DataError, match="--sandbox docker: isolation 'docker': expected auto, bwrap, unshare, none"):
        CodeTask(str(FIXTURE), isolation="docker")


def test_prompt_recipes():
    problem = "Print the sum of two integers.\n"
    deepcoder_stdin = code_prompt(problem, "", None, "deepcoder")
    assert deepcoder_stdin.startswith("You are an expert Python programmer.") and deepcoder_stdin.endswith(
        "(do not directly test on the sample inputs). Enclose your code within delimiters as follows. Ensure that "
        "when the python program runs, it reads the inputs, runs the algorithm and writes output to STDOUT.\n"
        "```python\n# YOUR CODE HERE\n```\n\n### Answer: (use the provided format with backticks)\n\n")
    assert code_prompt(problem, "add", "def add(a, b):", "lcb") == (
        "### Question:\nPrint the sum of two integers.\n\n\n### Format: You will use the following starter code to "
        "write the solution to the problem and enclose your code within delimiters.\n```python\ndef add(a, b):\n"
        "```\n\n### Answer: (use the provided format with backticks)\n\n")
    assert "```python\n# define add here\n```" in code_prompt(problem, "add", None, "deepcoder")  # no starter_code
    assert code_prompt("a {starter} b", "", None, "prime") == (
        "a {starter} b\n\nWrite Python code to solve the problem. Present the code in \n```python\nYour code\n```\n"
        "at the end.")
    assert code_prompt(problem, "add", None, "") == problem
    lcb = CodeTask(str(FIXTURE), template="lcb")
    assert lcb.problems[0].prompt.startswith("### Question:\nRead two integers") and "stdin" in lcb.problems[0].prompt
    assert "# define twoSum here" in lcb.problems[4].prompt and set(CODE_TEMPLATES) == {"deepcoder", "lcb", "prime"}


@pytest.mark.needs("pyarrow")
def test_an_apps_parquet_file_is_a_code_file(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    apps = tmp_path / "apps.parquet"  # APPS / TACO: the tests as JSON text in input_output
    pq.write_table(pa.Table.from_pylist([{"question": "Echo.", "input_output": json.dumps(
        {"inputs": ["x\n"], "outputs": ["x\n"]})}]), apps)
    assert is_code_file(str(apps)) and make_task(str(apps)).grade_batch(
        [(Problem("Echo.", f"{apps}:1"), fenced("print(input())"))], 0.0)[0].reward == 1.0


def test_code_file_shapes_and_mistakes(tmp_path):
    rows = tmp_path / "rows.jsonl"
    good = {"prompt": "p", "tests": {"inputs": ["1"], "outputs": ["1"]}}
    for lines, message in [
        ([good, {"prompt": "q", "answer": "2"}], r"rows.jsonl:2: missing field: expected one of tests, input_output"),
        ([{"prompt": "p", "tests": {"inputs": ["1"], "outputs": ["1", "2"]}}], r"rows.jsonl:1: tests: 1 inputs but 2"),
        ([{"tests": good["tests"]}], r"rows.jsonl:1: missing field: expected one of prompt"),
    ]:
        rows.write_text("".join(json.dumps(x) + "\n" for x in lines))
        with pytest.raises(DataError, match=message):
            make_task(str(rows))
    rows.write_text(json.dumps(good) + "\n")
    with pytest.raises(DataError, match="rows.jsonl is a file of code problems .* drop --reward"):
        make_task(str(rows), reward="r.py:f")


@pytest.mark.parametrize("flags, message", [
    (["--sandbox", "none"], "sandbox='none': no source of --data running_sum is a file of code problems"),
    (["--code-template", "lcb", "--sandbox-timeout", "2"], "code_template='lcb', sandbox_timeout=2.0: no source"),
    (["--data", str(FIXTURE), "--eval-every", "0", "--prompt-template", "pacs"],
     "--prompt-template pacs: --data .*code_problems.jsonl is code problems, whose prompt recipe is --code-template"),
])
def test_code_knobs_are_read_by_code_files_only(flags, message):
    with pytest.raises(DataError, match=message):
        data.load(config.parse_config(flags))


def test_bounds_of_the_code_knobs():
    for flags, message in [(["--sandbox", "docker"], "sandbox='docker': choose one of auto, bwrap, unshare, none"),
                           (["--code-template", "apps"], "code_template='apps': choose one of , deepcoder, lcb, prime"),
                           (["--sandbox-memory", "16"], "sandbox_memory=16: must be ≥ 64")]:
        with pytest.raises(DataError, match=message):
            config.validate(config.parse_config(flags), 1)


# ---------------------------------------------------------------- eval.py --responses

def no_model(*args, **kwargs):
    raise AssertionError("a model or tokenizer was loaded")


def test_eval_grades_given_responses_without_a_model(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(model, "load_model", no_model)
    monkeypatch.setattr(model, "check_model_folder", no_model)
    lines = [{"index": i, "response": fenced(row[kind])} for i, row in enumerate(fixture_problems())
             for kind in ("right", "wrong")] + [{"index": 0, "response": "no code"}]
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines if x["index"] != 3))
    evaluation.main(["--data", str(FIXTURE), "--responses", str(tmp_path / "r.jsonl"), "--out", str(tmp_path / "ev")])
    summary = json.loads((tmp_path / "ev" / "summary.json").read_text())
    records = [json.loads(x) for x in (tmp_path / "ev" / "problems.jsonl").read_text().splitlines()]
    assert summary["settings"]["k"] == [1] and summary["settings"]["n"] == [2, 3]  # --k unset: the k that fit
    assert [r["index"] for r in records] == [0, 1, 2, 4] and [r["correct"] for r in records] == [1, 1, 1, 1]
    m = summary["metrics"]
    assert m["eval/accuracy"] == pytest.approx((1 / 3 + 1 / 2 * 3) / 4) == m["eval/pass@1"]
    assert m["eval/code/no_program"] == pytest.approx(1 / 9) and "eval/length" not in m
    assert records[0]["samples"][2] == {"response": "no code", "extracted": None, "reward": 0.0, "correct": False,
                                        "failure": "", "details": {**PASSED, "code/tests_passed": 0.0, "code/no_program": 1.0}}
    assert "9 responses to 4 problems" in capsys.readouterr().out


@pytest.mark.parametrize("lines, flags, message", [
    ([{"index": 5, "response": "x"}], [], r"r.jsonl:1: 'index' must be an integer from 0 to 4 .* got 5"),
    ([{"index": 0, "response": "x"}, {"index": True, "response": "x"}], [], r"r.jsonl:2: 'index' must be an integer"),
    ([{"index": 0, "response": ["x"]}], [], r"r.jsonl:1: 'response' must be a string, got list"),
    ([{"index": 0, "response": "x"}], ["--k", "1,2"],
     r"--k 1,2: pass@2 needs 2 responses per problem, and problem 0 has 1"),
    ([{"index": 0, "response": "x"}], ["-n", "4"], r"-n samples responses; --responses brings its own"),
    ([{"index": 0, "response": "x"}], ["--data", "running_sum,countdown"], r"--data running_sum,countdown has several"),
    (None, [], r"--responses .*r.jsonl: no such file"),
])
def test_eval_responses_mistakes_name_the_line(tmp_path, lines, flags, message):
    if lines is not None:
        (tmp_path / "r.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    with pytest.raises(SystemExit, match=message):
        evaluation.main(["--data", str(FIXTURE), "--responses", str(tmp_path / "r.jsonl"), *flags,
                         "--out", str(tmp_path / "ev")])
