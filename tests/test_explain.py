"""python -m grading.explain: one verdict's steps, for the math grader and the built-in tasks. It runs
the grader's own functions, so its verdict is the grader's (checked against a MathGraderPool on the
fixtures of every rule family); the rule it names is the one docs/math.md numbers; a hostile response
is read in bounded time, cut in what is printed, and never crashes it."""
import json
import re
from pathlib import Path

import pytest

from grading.explain import explain_math, main

FIXTURES = Path(__file__).resolve().parent / "fixtures"
CASES = {c["id"]: c for c in map(json.loads, (FIXTURES / "answer_cases.jsonl").read_text().splitlines()) if c}
MB = 1 << 20


def steps(gold: str, response: str) -> dict[str, str]:
    return dict(explain_math(gold, response, cpu=2.0))


@pytest.mark.parametrize("case_id,rule", [
    ("time-pm-text", "3.3 a time of day"), ("var-4", "3.4 a letter as a variable"),
    ("multi-one-at-a-time", "3.1 several parts"), ("list-pairs-quad", "3.2 a list written without boxes"),
    ("decimal-comma", "3.6 a decimal comma"),
])
def test_the_verdict_is_the_graders_and_the_rule_is_named(case_id, rule, math_grader):
    case = CASES[case_id]
    graded = math_grader(case["response"], case["gold"])
    shown = steps(case["gold"], case["response"])
    assert shown["verdict"].startswith(f"{graded.reward} ") and graded.reward == case["expected"]
    assert shown["rule"].startswith(rule) or f"; {rule}" in shown["rule"], shown["rule"]


def test_it_says_why_a_box_is_a_step_and_what_found_the_answer():
    shown = steps("2, 3", "\\boxed{2}, which is not prime, and \\boxed{3}")
    assert "the step word 'not'" in shown["boxes"] and shown["final answer"] == "2.1 the last box: '3'"
    assert shown["verdict"].startswith("0.0")
    shown = steps("#### 7", "so \\boxed{5}. Final Answer: The final answer is $7$.")
    assert shown["gold"] == "'7'  (1.1 GSM8K's ####)"
    assert shown["final answer"] == "2.2 a final answer stated after the last box: '7'"
    assert shown["verdict"].startswith("1.0")


@pytest.mark.parametrize("response,verdict", [
    ("\\boxed{" + "{" * 3000 + "54" + "}" * 3000 + "}", "0.0: a box, #### line or tag longer than 4096"),
    ("\\boxed{9^{9^{9^{9}}}}", "0.0: 4.1 the pre-check"),
    ("\\boxed{(x+1)^{10^{10}}}", "0.0, failure timeout: 4.2 over 0.5 s of CPU time"),
    ("la " * (MB // 3) + "so 54", "1.0"),
])
def test_hostile_responses_end_in_a_bound(response, verdict, capsys, tmp_path):
    path = tmp_path / "response.txt"
    path.write_text(response)
    main(["--gold", "54", "--response", f"@{path}", "--grade-cpu", "0.5"])
    printed = capsys.readouterr().out
    assert f"verdict       {verdict}" in printed and max(map(len, printed.splitlines())) < 500


def test_the_built_in_tasks(capsys):
    main(["--task", "running_sum", "--gold", "54", "--response", "12+7=19 19+35=54 <answer>054</answer>"])
    assert capsys.readouterr().out.splitlines()[-2:] == [
        "read          the last <answer> tag, within 8192 characters before its end: '054'",
        "verdict       1.0, answer '54'"]
    main(["--task", "countdown", "--gold", '{"numbers": [3, 5, 7], "target": 22}', "--response", "<answer>3*7+5</answer>"])
    assert capsys.readouterr().out.splitlines()[-2:] == ["parsed        value 26, numbers used [3, 5, 7]",
                                                         "verdict       0.0, answer '3*7+5'"]


def test_a_data_files_row_gives_the_gold(capsys):
    main(["--data", str(FIXTURES / "gsm8k.jsonl"), "--row", "1", "--response", "#### 1200"])
    printed = capsys.readouterr().out
    assert "gold          '1,200'" in printed and "verdict       1.0" in printed


@pytest.mark.parametrize("argv,said", [
    (["--data", str(FIXTURES / "gsm8k.jsonl"), "--row", "9"], "--row 9: .*gsm8k.jsonl has rows 0 to 4"),
    (["--task", "countdown", "--gold", "5"], "countdown's gold is"),
    (["--gold", "1", "--data", str(FIXTURES / "gsm8k.jsonl")], "one of them"),
])
def test_a_mistake_is_said_not_raised(argv, said, capsys):
    with pytest.raises(SystemExit):
        main([*argv, "--response", "x"])
    assert re.search(said, capsys.readouterr().err)
