"""A model's output is hostile input: the graders stay bounded in time and never raise.

Each case is graded by both built-in tasks; `right` is the task's correct answer, so a case can
carry it. The expected verdict is decided from the grading rules (the content after the last
opening tag before the last closing tag; running_sum wants `-?\\d+` equal to the sum; countdown
wants each number used once and the target) and from the documented bounds, before running. The
math path (FileTask, math-verify workers) has its own cases, decided from `_answer_region`'s
rules and MATH_ANSWER_CHARS, and expressions whose size explodes under sympy, shown ended by the
worker's own CPU bound (the same process answers) rather than timed. Timing bounds are generous on
purpose (1 s per response is the spec; built-in cases take milliseconds): run with -s to see the
measured times.
"""
import json
import random
import re
import signal
import time
from collections import Counter

import pytest

import rewards
from rewards import Problem, Verdict, extract_tag, grade_batch
from grading import countdown, pool
from grading.countdown import CountdownTask
from grading.files import FileTask
from grading.pool import MathGrader
from tasks import RunningSumTask

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
    # the content starts at the last opening tag before the closing one: the stray tags are dropped
    ("unclosed_tags_then_answer", lambda r: "<answer>" * (MB // 8) + tag(r), True),
    ("stray_open_tag_before_answer", lambda r: "<answer>x " + tag(r), True),
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
    """The rfind-based extract_tag decides as a plain regex of its rule does, on random strings of
    tag fragments: greedy `.*` puts the opening tag as late as a closing tag after it allows."""
    assert extract_tag("<answer>x <answer>7</answer>") == "7"
    rng = random.Random(0)
    pieces = ["<answer>", "</answer>", "7", " ", "<answer", "answer>", "x"]
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        found = re.fullmatch(r".*<answer>(.*)</answer>.*", text, flags=re.DOTALL)
        assert extract_tag(text) == (found.group(1).strip() if found else None), text


@pytest.mark.parametrize("task_name", TASKS)
def test_exception_inside_grading_scores_zero_with_failure(task_name, monkeypatch):
    def broken(*args):
        raise RuntimeError("grader bug")
    monkeypatch.setattr(rewards, "extract_tag", broken)
    monkeypatch.setattr(countdown, "extract_tag", broken)  # countdown's grader, in grading/countdown.py
    task, problem, right = TASKS[task_name]
    assert task.grade(problem, tag(right)) == rewards.Verdict(0.0, None, "error")


WORST = ("digits_1MB", "unary_minus_1MB", "unclosed_parens_1MB", "unclosed_tags_1MB",
         "unclosed_tags_then_answer", "mul_chain_1MB", "mul_chain_1KB", "ones_chain_1KB",
         "div_chain_1KB", "squaring_tower")


@pytest.mark.parametrize("task_name", TASKS)
def test_batch_of_128_worst_cases_within_5s(task_name):
    """The slowest kinds before the bounds (1 MB of unclosed tags, 1 MB multiplication chains,
    1 MB digit strings, deep nesting), 128 responses: one step's worth of a drifted policy."""
    task, problem, right = TASKS[task_name]
    worst = [(build(right), rewarded is True or rewarded == task_name)
             for case_id, build, rewarded in CASES if case_id in WORST]
    batch = [worst[i % len(worst)] for i in range(128)]
    start = time.perf_counter()
    verdicts = grade_batch(task, [(problem, response) for response, _ in batch])
    seconds = time.perf_counter() - start
    print(f"\nbatch of 128 worst cases, {task_name}: {seconds:.3f} s")
    assert [v.reward for v in verdicts] == [float(rewarded) for _, rewarded in batch]
    assert all(v.failure == "" for v in verdicts)
    assert seconds <= 5.0


# ----------------------------------------------------------------------------- the math path

# (id, response, rewarded?, may time out?) against the gold answer 54. Only answers that reach
# sympy can time out (by design: the worker is killed at grade_timeout, 1 s here); an answer
# longer than MATH_ANSWER_CHARS (4096) scores 0 unsent.
MATH_CASES = [
    ("text_1MB_then_boxed", "word " * (MB // 5) + "\\boxed{54}", True, False),
    ("boxed_then_text_1MB", "\\boxed{54}" + " and so on" * (MB // 10), True, False),
    ("text_1MB_no_number", "la " * (MB // 3), False, False),
    ("text_1MB_then_number", "la " * (MB // 3) + "so 54", True, False),  # the last number, in the tail
    ("power_tower", "\\boxed{9^{9^{9^{9^{9}}}}}", False, True),
    ("googol_factorial", "\\boxed{(10^{100})!}", False, True),
    ("digits_5000_boxed", "\\boxed{" + "9" * 5000 + "}", False, False),
    ("digits_5000_plain", "so it is " + "9" * 5000, False, False),  # cut: no whole number in the tail
    ("digits_4000_boxed", "\\boxed{" + "9" * 4000 + "}", False, True),  # inside the bound: parsed
    ("braces_2000_deep", "\\boxed{" + "{" * 2000 + "1" + "}" * 2000 + "}", False, True),
    ("braces_1MB_deep", "\\boxed{" + "{" * MB + "54" + "}" * MB, False, False),
    ("unclosed_boxes_1MB", "\\boxed{" * (MB // 7), False, False),
    ("open_braces_1MB", "{" * MB, False, False),
    ("open_braces_1MB_then_boxed", "{" * MB + " \\boxed{54}", True, False),
    ("nul_bytes_around", "\x00" * MB + "\\boxed{54}" + "\x00" * 100, True, False),
    ("lone_surrogates_around", "\ud800" * 1000 + "\\boxed{54}" + "\udfff", True, False),
    ("lone_surrogate_answer", "\\boxed{\ud800}", False, False),
    ("lone_surrogates_1MB", "\udfff" * MB, False, False),
    ("hashes_then_1MB_line", "#### " + "7" * MB, False, False),
    ("hashes_then_babble", "#### 54\n" + "babble " * (MB // 7), True, False),
    ("stray_open_tag_before_answer", "<answer>x <answer>54</answer>", True, False),
    ("unclosed_tags_1MB", "<answer>" * (MB // 8), False, False),
    ("tag_past_the_bound", tag("5" * 5000), False, False),
]


@pytest.fixture(scope="module")
def math_task(tmp_path_factory):
    path = tmp_path_factory.mktemp("math") / "gold.jsonl"
    path.write_text(json.dumps({"question": "Add 12+7+35", "answer": "#### 54"}) + "\n")
    task = FileTask(str(path), grade_timeout=1.0, workers=4)
    yield task
    task.close()


def _math_verdict_is_expected(verdict, rewarded: bool, may_time_out: bool) -> bool:
    if verdict.failure == "":
        return verdict.reward == float(rewarded)
    return verdict.reward == 0.0 and verdict.failure == "timeout" and may_time_out


@pytest.mark.parametrize("case_id,response,rewarded,may_time_out", MATH_CASES, ids=[c[0] for c in MATH_CASES])
def test_hostile_output_on_the_math_path(math_task, case_id, response, rewarded, may_time_out):
    # a worker the case before killed restarts, and warms up for answers that are no number, outside the timed part
    math_task.grade(math_task.problems[0], "\\boxed{x}")
    start = time.perf_counter()
    verdict = math_task.grade(math_task.problems[0], response)
    seconds = time.perf_counter() - start
    print(f"\n{case_id:28s} {len(response):>9d} chars {seconds * 1000:7.1f} ms {verdict.failure}")
    assert _math_verdict_is_expected(verdict, rewarded, may_time_out), verdict
    assert seconds <= 5.0  # the spec: 1 s, or the 1 s timeout


MATH_WORST = ("text_1MB_then_boxed", "power_tower", "googol_factorial", "digits_5000_boxed",
              "digits_5000_plain", "digits_4000_boxed", "braces_2000_deep", "braces_1MB_deep",
              "nul_bytes_around", "lone_surrogates_around", "unclosed_boxes_1MB")


@pytest.mark.slow
def test_math_batch_of_128_worst_cases_within_the_budget(math_task):
    """128 of the worst math cases under a 5 s budget: the batch ends on time, what was graded is
    right, the rest is counted as a failure, and the next batch is graded normally."""
    worst = [case for case in MATH_CASES if case[0] in MATH_WORST]
    batch = [worst[i % len(worst)] for i in range(128)]
    problem = math_task.problems[0]
    grade_batch(math_task, [(problem, "\\boxed{x}")] * len(math_task.grader.graders))  # every worker started, warmed
    start = time.perf_counter()
    verdicts = grade_batch(math_task, [(problem, case[1]) for case in batch], budget=5.0)
    seconds = time.perf_counter() - start
    print(f"\nbatch of 128 worst math cases: {seconds:.2f} s, {Counter(v.failure for v in verdicts)}")
    for (case_id, _, rewarded, may_time_out), verdict in zip(batch, verdicts):
        assert verdict.failure == "budget" or _math_verdict_is_expected(verdict, rewarded, may_time_out), (
            case_id, verdict)
    assert seconds <= 8.0  # the spec: 5 s
    after = grade_batch(math_task, [(problem, "\\boxed{54}"), (problem, "#### 53")])
    assert [(v.reward, v.failure) for v in after] == [(1.0, ""), (0.0, "")]


# ----------------------------------------------------------------------------- expressions whose size explodes

INTEGRAL = "\\int_{0}^{1} \\frac{\\ln x}{1-x}\\,dx"  # -pi^2/6; sympy spends seconds comparing anything with it
# (id, response, gold): before the worker's own CPU bound each took sympy from 2 s to past the 10 s
# --grade-timeout on this machine (docs/data-and-eval.md); the pre-check reads none of them (not plain arithmetic)
EXPLODING = [
    ("power_tower_vs_integral", "\\boxed{x^{x^{x^{x^x}}}}", INTEGRAL),
    ("exp_tower_vs_integral", "\\boxed{e^{e^{e^{e^{e^x}}}}}", INTEGRAL),
    ("power_of_a_sum", "\\boxed{(x+1)^{1000}}", "x^2+2x+1"),
    ("power_of_three_terms", "\\boxed{(x+y+z)^{60}}", "54"),
    ("huge_power_of_a_sum", "\\boxed{(x+1)^{10^{10}}}", "54"),
    ("huge_binomial", "\\boxed{\\binom{10^{9}}{5 \\cdot 10^{8}}}", "54"),
    ("huge_product", "\\boxed{\\prod_{k=1}^{10^{9}} k}", "54"),
    ("huge_gamma", "\\boxed{\\Gamma(10^{100})}", "54"),
]


@pytest.fixture(scope="module")
def patient_grader():
    """One real worker whose parent waits a minute before it kills it: a verdict that comes back from
    the same process was ended by the worker's own bound, --grade-cpu."""
    grader = MathGrader(timeout=60.0, cpu=1.0)  # the bound under test, not its default: a quick one
    yield grader
    grader.close()


@pytest.mark.slow
@pytest.mark.parametrize("case_id,response,gold", EXPLODING, ids=[c[0] for c in EXPLODING])
def test_an_exploding_answer_ends_at_the_workers_own_bound(patient_grader, case_id, response, gold):
    patient_grader("\\boxed{1}", "1")  # the worker starts outside the timed part
    pid = patient_grader._proc.pid
    start = time.perf_counter()
    verdict = patient_grader(response, gold)
    print(f"\n{case_id:28s} {(time.perf_counter() - start) * 1000:7.1f} ms {verdict.failure}")
    assert verdict.reward == 0.0 and verdict.failure in ("", "timeout"), verdict
    assert patient_grader._proc is not None and patient_grader._proc.pid == pid  # it answered; never killed
    assert patient_grader("\\boxed{-\\frac{\\pi^2}{6}}", "-\\frac{\\pi^{2}}{6}") == Verdict(1.0, "-1*pi**2/6")


def _spin(cpu_seconds: float) -> None:
    """Burn CPU time, at most cpu_seconds: a bound that fails lets the test fail, not hang."""
    end = time.process_time() + cpu_seconds
    while time.process_time() < end:
        pass


def _swallow_once() -> None:
    try:
        _spin(30.0)
    except BaseException:  # noqa: BLE001 - a bare `except:` in library code, which the repeated signal outlasts
        pass
    _spin(30.0)


def test_the_cpu_bound_ends_a_computation_and_disarms():
    """within_cpu raises OverCPU once its CPU time is spent, even past an `except:` that swallows
    the first signal, and leaves no timer armed; what ends in time returns its value."""
    previous = signal.signal(signal.SIGPROF, pool.on_cpu_limit)
    try:
        for work in (lambda: _spin(30.0), _swallow_once):
            with pytest.raises(pool.OverCPU):
                pool.within_cpu(0.05, work)
            assert signal.getitimer(signal.ITIMER_PROF) == (0.0, 0.0)
        assert pool.within_cpu(5.0, sum, [1, 2]) == 3
        assert signal.getitimer(signal.ITIMER_PROF) == (0.0, 0.0)
        signal.setitimer(signal.ITIMER_PROF, 0.01)  # a signal outside a bounded call is ignored
        _spin(0.05)
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)
