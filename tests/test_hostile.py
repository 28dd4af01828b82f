"""A model's output is hostile input: the built-in graders stay bounded in time and never raise.

Each case is graded by both built-in tasks; `right` is the task's correct answer, so a case can
carry it. The expected verdict is decided from the grading rules (the last <answer> pair, pairs
read left to right; running_sum wants `-?\\d+` equal to the sum; countdown wants each number used
once and the target) and from the documented bounds, before running. Timing bounds are generous
on purpose (1 s per response is the spec; each case takes milliseconds): run with -s to see the
measured times.
"""
import json
import random
import re
import time

import pytest

import rewards
from rewards import CountdownTask, Problem, RunningSumTask, extract_tag

MB = 1 << 20
TASKS = {  # task, problem, its correct answer written plainly
    "running_sum": (RunningSumTask(), Problem("Add 12+7+35", "54"), "54"),
    "countdown": (CountdownTask(), Problem("...", json.dumps({"numbers": [3, 5, 7], "target": 22})), "3*5+7"),
}
UNICODE_RIGHT = {  # \d and int() accept any Unicode decimal digit, and always have: still correct
    "arabic_indic": {"running_sum": "٥٤", "countdown": "٣*٥+٧"},
    "fullwidth": {"running_sum": "５４", "countdown": "３*５+７"},
}


def tag(body: str) -> str:
    return f"<answer>{body}</answer>"


def _squarings(expr: str, times: int) -> str:
    """Exponent-like growth without an exponent: _squarings("9", 2) -> "((9)*(9))*((9)*(9))"."""
    for _ in range(times):
        expr = f"({expr})*({expr})"
    return expr


# (id, response builder given the task's right answer, rewarded?) -- one tuple per hostile output
CASES = [
    ("digits_5000", lambda r: tag("9" * 5000), False),  # past int()'s 4,300-digit limit
    ("digits_1MB", lambda r: tag("9" * MB), False),
    ("negative_digits_5000", lambda r: tag("-" + "9" * 5000), False),
    ("unary_minus_2000", lambda r: tag("-" * 2000 + "3"), False),
    ("unary_minus_1MB", lambda r: tag("-" * MB + "3"), False),
    # the right equation under 1,200 parentheses: past MAX_NESTING, not a sane answer
    ("parens_1200", lambda r: tag("(" * 1200 + r + ")" * 1200), False),
    ("unclosed_parens_1MB", lambda r: tag("(" * MB + r), False),
    ("unclosed_braces_1MB", lambda r: tag("{" * MB + r), False),
    ("unclosed_tags_1MB", lambda r: "<answer>" * (MB // 8), False),
    # the opening tags pair with the last closing one: the content holds tags, not the answer
    ("unclosed_tags_then_answer", lambda r: "<answer>" * (MB // 8) + tag(r), False),
    ("stray_open_tag_before_answer", lambda r: "<answer>x " + tag(r), False),
    ("many_tags_last_right", lambda r: tag("1") * (MB // 18) + tag(r), True),
    ("many_tags_last_wrong", lambda r: tag(r) * (MB // 24) + tag("1"), False),
    ("answer_then_1MB_babble", lambda r: tag(r) + " and so on" * (MB // 10), True),
    ("answer_then_unclosed_tag_and_junk", lambda r: tag(r) + "<answer>" + "7" * MB, True),
    ("nul_bytes_around", lambda r: "\x00" * MB + tag(r) + "\x00" * 100, True),
    ("nul_byte_inside", lambda r: tag("5\x004"), False),
    ("lone_surrogates_around", lambda r: "\ud800" * 1000 + tag(r) + "\udfff", True),
    ("lone_surrogate_answer", lambda r: tag("\ud800"), False),
    ("superscript_digit", lambda r: tag("\u00b2"), False),  # isdigit() but not int()-able
    ("mul_chain_1MB", lambda r: tag("99*" * (MB // 3) + "99"), False),
    ("mul_chain_1KB", lambda r: tag("99*" * 300 + "99"), False),  # inside the window: MAX_BITS stops it
    ("ones_chain_1KB", lambda r: tag("*".join(["1"] * 500)), False),  # the most arithmetic the window allows
    ("div_chain_1KB", lambda r: tag("1" + "/97" * 300), False),  # denominators past MAX_BITS
    ("squaring_tower", lambda r: tag(_squarings("99", 7)), False),  # 99**128: 849 bits, 900 chars
    ("power_operator", lambda r: tag("10**10**10"), False),
    ("empty_answer", lambda r: tag(""), False),
    ("leading_zeros_past_int_limit", lambda r: tag("0" * 5000 + r), "running_sum"),  # still 54
]


def _grade_timed(task_name: str, response: str):
    task, problem, _ = TASKS[task_name]
    start = time.perf_counter()
    verdict = task.grade(problem, response)
    return verdict, time.perf_counter() - start


@pytest.mark.parametrize("task_name", TASKS)
@pytest.mark.parametrize("case_id,build,rewarded", CASES, ids=[c[0] for c in CASES])
def test_hostile_output_is_graded_fast_without_failure(task_name, case_id, build, rewarded):
    response = build(TASKS[task_name][2])
    verdict, seconds = _grade_timed(task_name, response)
    print(f"\n{case_id:36s} {task_name:12s} {len(response):>9d} chars {seconds * 1000:7.2f} ms")
    expected = rewarded is True or rewarded == task_name
    assert verdict.reward == float(expected), verdict
    assert verdict.failure == ""  # a decision, not a grader failure
    assert seconds <= 1.0


@pytest.mark.parametrize("task_name", TASKS)
@pytest.mark.parametrize("script", UNICODE_RIGHT)
def test_unicode_digits_keep_their_meaning(task_name, script):
    verdict, seconds = _grade_timed(task_name, "<think>x</think>" + tag(UNICODE_RIGHT[script][task_name]))
    assert verdict.reward == 1.0 and seconds <= 1.0
    if task_name == "running_sum":
        assert verdict.answer == "54"  # normalised as str(int()) would


def test_right_answer_under_a_few_parentheses_still_counts():
    task, problem, _ = TASKS["countdown"]
    assert task.grade(problem, tag("((((3)*(5)))+-(-7))")).reward == 1.0
    assert task.grade(problem, tag("-" * 64 + "3")).reward == 0.0  # 64 signs: allowed, just wrong
    task, problem, _ = TASKS["running_sum"]
    assert task.grade(problem, tag("-0054")).answer == "-54"
    assert task.grade(problem, tag("-000")).answer == "0"


def test_correct_answer_region_survives_the_window():
    """The longest gold answer str() can write (4,300 digits) with spaces fits the running_sum
    window; countdown's 1,024-character window cuts a padded pair, documented as not sane."""
    task, _, _ = TASKS["running_sum"]
    gold = "9" * 4300
    response = "x" * MB + tag(" " * 1000 + gold + " " * 1000) + "y" * MB
    assert task.grade(Problem("Add ...", gold), response).reward == 1.0
    task, problem, right = TASKS["countdown"]
    assert task.grade(problem, tag(" " * 900 + right)).reward == 1.0
    assert task.grade(problem, tag(" " * 2000 + right)).reward == 0.0


def test_extract_tag_matches_the_plain_regex_rule():
    """The linear extract_tag decides as re.findall did, on random strings of tag fragments."""
    rng = random.Random(0)
    pieces = ["<answer>", "</answer>", "7", " ", "<answer", "answer>", "x"]
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        found = re.findall(r"<answer>(.*?)</answer>", text, flags=re.DOTALL)
        assert extract_tag(text) == (found[-1].strip() if found else None), text


@pytest.mark.parametrize("task_name", TASKS)
def test_exception_inside_grading_scores_zero_with_failure(task_name, monkeypatch):
    def broken(*args):
        raise RuntimeError("grader bug")
    monkeypatch.setattr(rewards, "extract_tag", broken)
    task, problem, right = TASKS[task_name]
    assert task.grade(problem, tag(right)) == rewards.Verdict(0.0, None, "error")


@pytest.mark.parametrize("task_name", TASKS)
def test_batch_of_128_worst_cases_within_5s(task_name):
    """The slowest kinds before the bounds (1 MB of unclosed tags, 1 MB multiplication chains,
    1 MB digit strings, deep nesting), 128 responses: one step's worth of a drifted policy."""
    worst = [CASES[i][1](TASKS[task_name][2]) for i in (1, 4, 6, 8, 9, 20, 21, 22, 23, 24)]
    batch = [worst[i % len(worst)] for i in range(128)]
    task, problem, _ = TASKS[task_name]
    start = time.perf_counter()
    verdicts = [task.grade(problem, r) for r in batch]
    seconds = time.perf_counter() - start
    print(f"\nbatch of 128 worst cases, {task_name}: {seconds:.3f} s")
    assert all(v.reward == 0.0 and v.failure == "" for v in verdicts)
    assert seconds <= 5.0
