"""Graders, answer extraction, data-file errors, pass@k."""
import json

import pytest

from eval import pass_at_k
from grading.math_answers import gold_answer
from grading.countdown import CountdownTask, parse_arithmetic
from rewards import DataError, Problem, Verdict, overlong_penalty
from data import make_task
from grading.files import load_file
from tasks import RunningSumTask, builtin_splits


def test_running_sum_solution_and_grader():
    task = RunningSumTask()
    assert task.solution([12, 7, 35]) == "12+7=19 19+35=54 <answer>54</answer>"
    p = Problem("Add 12+7+35", "54")
    assert task.grade(p, "12+7=19 19+35=54 <answer>54</answer>").reward == 1.0
    assert task.grade(p, "<answer>53</answer>").reward == 0.0
    assert task.grade(p, "54").reward == 0.0  # the tag is required
    assert task.grade(p, "<answer>5 4</answer>").reward == 0.0


def test_running_sum_difficulty_knobs_and_splits():
    task = make_task("running_sum", sum_min_terms=6, sum_max_terms=6, sum_digits=3)
    train, heldout = builtin_splits(task)
    assert all(len(p.prompt[4:].split("+")) == 6 for p in heldout[:50])
    assert all(int(t) < 1000 for p in heldout[:50] for t in p.prompt[4:].split("+"))
    assert not {p.prompt for p in heldout} & {p.prompt for p in train}
    assert builtin_splits(task)[1] == heldout  # seeded
    with pytest.raises(DataError, match="sum_min_terms"):
        make_task("running_sum", sum_min_terms=5, sum_max_terms=3)


def test_countdown_parser_and_grader():
    assert parse_arithmetic("(1 + 2) / 3") == (1, [1, 2, 3])
    assert parse_arithmetic("-3*(2-5)") == (9, [3, 2, 5])
    for bad in ["__import__('os')", "2**3", "1/0", "(1+2", "1 2"]:
        with pytest.raises(ValueError):
            parse_arithmetic(bad)
    task = CountdownTask()
    p = Problem("...", json.dumps({"numbers": [3, 5, 7], "target": 22}))
    assert task.grade(p, "<think>x</think><answer>3*5+7</answer>").reward == 1.0
    assert task.grade(p, "<answer>3*5+7+0</answer>").reward == 0.0  # 0 is not one of the numbers
    assert task.grade(p, "<answer>5*5-3</answer>").reward == 0.0  # 5 used twice, 7 unused
    assert task.grade(p, "<answer>__import__('os').system('x')</answer>").reward == 0.0
    problem, nums = task.sample(__import__("random").Random(1))
    assert "create an equation that equals" in problem.prompt
    assert json.loads(problem.answer)["numbers"] == nums


def test_gold_and_predicted_answers():
    assert gold_answer("She pays 3*4 = 12.\n#### 12") == "12"
    assert gold_answer("so x = \\boxed{\\frac{1}{2}}.") == "\\frac{1}{2}"
    assert gold_answer("$\\fbox{5}$ and $\\boxed{6}$ then $\\fbox{7}$.") == "7"  # the last one, as MATH writes them
    assert gold_answer("the answer is $\\boxed 9$.") == "9"
    assert gold_answer("no box: 12") == "no box: 12"
    task = RunningSumTask()  # the tag's content, normalised, is what maj@n votes on
    assert task.grade(Problem("Add 1+2", "3"), "<answer> 03 </answer>") == Verdict(1.0, "3")
    assert task.grade(Problem("Add 1+2", "3"), "<answer>x</answer>") == Verdict(0.0, "x")
    assert task.grade(Problem("Add 1+2", "3"), "3") == Verdict(0.0, None)


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_jsonl_fields_and_errors(tmp_path):
    ok = write(tmp_path, "ok.jsonl", json.dumps({"question": "1+1?", "answer": "so #### 2"}) + "\n\n"
               + json.dumps({"problem": "x", "solution": "\\boxed{3}"}) + "\n")
    assert load_file(ok) == [Problem("1+1?", "2"), Problem("x", "3")]
    bad = write(tmp_path, "bad.jsonl", json.dumps({"prompt": "a", "answer": "1"}) + "\n{oops\n")
    with pytest.raises(DataError, match=r"bad.jsonl:2: not valid JSON"):
        load_file(bad)
    missing = write(tmp_path, "missing.jsonl", json.dumps({"prompt": "a", "label": "1"}) + "\n")
    with pytest.raises(DataError, match=r"missing.jsonl:1: missing field: expected one of answer, "
                                        r"ground_truth, solution; the line has label, prompt"):
        load_file(missing)
    lines_named_json = write(tmp_path, "hf.json", json.dumps({"question": "q", "answer": "#### 4"}) + "\n"
                             + json.dumps({"question": "r", "answer": "#### 5"}) + "\n")
    assert load_file(lines_named_json) == [Problem("q", "4"), Problem("r", "5")]  # HF datasets' to_json
    empty = write(tmp_path, "empty.jsonl", "\n")
    with pytest.raises(DataError, match=r"empty.jsonl: the dataset is empty"):
        load_file(empty)
    with pytest.raises(DataError, match="no such file"):
        load_file(str(tmp_path / "nope.jsonl"))
    with pytest.raises(DataError, match="not a built-in task"):
        make_task("gsm9k")


def test_overlong_penalty_docstring_values():
    assert [overlong_penalty(n, 20, 4) for n in (16, 18, 20, 25)] == [0.0, -0.5, -1.0, -1.0]


def test_pass_at_k_spec_values():
    assert pass_at_k(4, 2, 1) == pytest.approx(0.5)
    assert pass_at_k(4, 2, 2) == pytest.approx(0.833333, abs=1e-6)
    assert pass_at_k(256, 3, 64) == pytest.approx(0.5797823066, abs=1e-9)


def test_a_grader_returning_a_number_past_floats_range_scores_0_without_raising():
    """math.isfinite(10**400) raises OverflowError: is_reward says False, and graded counts an error."""
    from rewards import Problem, graded, is_reward
    assert not is_reward(10 ** 400) and is_reward(10 ** 300) and is_reward(True)
    verdict = graded(lambda problem, response: 10 ** 400, Problem("p", "1"), "r")
    assert verdict.reward == 0.0 and verdict.failure == "error"
