"""MathGrader (math-verify in a worker process): answer-equivalence fixtures, time limits, crashes,
threads; grade_batch with a pool of workers and a budget. The fixture pairs are in
tests/fixtures/grader_pairs.jsonl, each verdict decided from the mathematics before the grader was
run."""
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from grading import pool
from grading.math_answers import math_request
from grading.pool import MathGrader, MathGraderPool, module_command
from rewards import Problem, Verdict, grade_batch
from data import make_task
from grading.files import FileTask
from tasks import RunningSumTask

FIXTURES = Path(__file__).resolve().parent / "fixtures"
HANG = [sys.executable, str(FIXTURES / "hang_worker.py")]
CRASH = [sys.executable, str(FIXTURES / "crash_worker.py")]
SCRIPTED = [sys.executable, str(FIXTURES / "scripted_worker.py")]


def _pairs():
    params = []
    for lineno, line in enumerate((FIXTURES / "grader_pairs.jsonl").read_text().splitlines(), 1):
        if not line.strip():
            continue
        pair = json.loads(line)
        params.append(pytest.param(pair, id=f"{lineno}-{pair['case']}"))
    return params


PAIRS = _pairs()


@pytest.fixture(scope="module")
def grader():
    g = MathGrader(timeout=10.0)
    yield g
    g.close()


def test_fixture_file_is_well_formed():
    pairs = [p.values[0] for p in PAIRS]
    assert len(pairs) >= 45
    for pair in pairs:
        assert set(pair) <= {"gold", "response", "expected", "case", "why"}, pair
        assert isinstance(pair["gold"], str) and isinstance(pair["response"], str), pair
        assert pair["expected"] in (0, 1) and pair["case"] and pair["why"], pair
    assert {p["expected"] for p in pairs} == {0, 1}


@pytest.mark.parametrize("pair", PAIRS)
def test_grader_pair(grader, pair):
    verdict = grader(pair["response"], pair["gold"])
    assert verdict.failure == "", verdict
    assert verdict.reward == pair["expected"], (
        f"gold={pair['gold']!r} response={pair['response']!r} expected={pair['expected']} "
        f"got={verdict.reward} (extracted {verdict.answer!r}); {pair['why']}")


def test_verdict_carries_the_extracted_answer(grader):
    verdict = grader("so $x = \\boxed{\\frac{1}{2}}$", "0.5")
    assert isinstance(verdict, Verdict) and verdict.reward == 1.0 and verdict.answer == "1/2"
    assert grader("I don't know.", "5") == Verdict(0.0, None, "")



@pytest.mark.parametrize("response,gold,plain", [
    ("\\boxed{42}", "42", True),  # eval.py --responses' usual file: the worker needs only its first warm-up pair
    ("So $x = \\boxed{\\frac{1}{2}}$", "0.5", True),
    ("#### 54", "54", True),  # GSM8K's line is the region, and it is the answer
    ("The answer is 54, not 53.", "54", False),  # math-verify reads the whole line
    ("\\boxed{x+1}", "42", False),
    ("\\boxed{42}", "\\int_{0}^{1} x \\, dx", False),  # the gold is no number
    ("\\boxed{3}, \\boxed{5}", "3, 5", False),  # a multi-part gold
    ("I don't know.", "5", False),  # no final answer: math-verify reads the tail
])
def test_only_plain_arithmetic_skips_the_rest_of_the_warm_up(response, gold, plain):
    """A worker grades the whole warm-up before its first request that is not plain arithmetic on both
    sides (pool.numbers), so that the CPU bound stays sized for a warmed worker whatever the answer."""
    assert pool.numbers(math_request(response, gold)) is plain


def test_file_task_grades_with_math_verify(tmp_path):
    path = tmp_path / "gsm.jsonl"
    path.write_text(json.dumps({"question": "How many?", "answer": "48 + 24 = 72\n#### 1,000"}) + "\n")
    task = FileTask(str(path), grade_timeout=10.0)
    try:
        problem = task.problems[0]
        assert task.grade(problem, "#### 1000").reward == 1.0
        assert task.grade(problem, "she has \\boxed{999}").reward == 0.0
    finally:
        task.close()


def test_file_task_without_math_verify_fails_before_any_model_loads(tmp_path, monkeypatch):
    import importlib.util

    import rewards
    path = tmp_path / "gsm.jsonl"
    path.write_text(json.dumps({"question": "q", "answer": "#### 1"}) + "\n")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(rewards.DataError, match="needs math-verify: pip install math-verify"):
        FileTask(str(path))


@pytest.mark.slow
def test_timeout_scores_zero_and_next_call_gets_a_fresh_worker():
    g = MathGrader(timeout=0.5, command=HANG)
    try:
        start = time.monotonic()
        verdict = g("\\boxed{1}", "1")
        assert time.monotonic() - start < 5.0
        assert verdict == Verdict(0.0, None, "timeout")
        assert g._proc is None  # the hung worker was killed
        start = time.monotonic()
        assert g("\\boxed{1}", "1") == Verdict(0.0, None, "timeout")  # a fresh worker, same limit
        assert time.monotonic() - start < 5.0
    finally:
        g.close()


@pytest.mark.slow
def test_timeout_counted_over_a_batch():
    g = MathGrader(timeout=0.3, command=HANG)
    try:
        verdicts = [g("\\boxed{1}", "1") for _ in range(3)]
    finally:
        g.close()
    assert sum(v.failure == "timeout" for v in verdicts) == 3
    assert sum(v.reward for v in verdicts) == 0.0


@pytest.mark.slow
def test_real_worker_times_out_on_a_hanging_answer_then_recovers():
    """sympy takes seconds on (x+1)^{10^{10}} (the pre-check leaves it: not plain arithmetic): the
    parent's 1 s of wall time comes before the worker's own CPU bound (--grade-cpu, 4 s) and kills
    it; a timeout, then the next answer is graded by a fresh worker."""
    g = MathGrader(timeout=1.0)
    try:
        g("\\boxed{x}", "x")  # its start and warm-up (for an answer that is no number) outside the timed part
        start = time.monotonic()
        assert g("\\boxed{(x+1)^{10^{10}}}", "3") == Verdict(0.0, None, "timeout")
        assert time.monotonic() - start < 5.0
        g.timeout = 10.0  # the fresh worker's first answer is not the thing under test
        assert g("The answer is \\boxed{7}.", "7").reward == 1.0
    finally:
        g.close()


@pytest.mark.slow
def test_a_warm_up_that_a_request_needs_is_timed_as_a_start():
    """What a worker says between "warming" and "warm" (the rest of the math worker's warm-up) is
    not the answer's: 2.5 s of it under a 1 s limit still gets the answer's verdict."""
    g = MathGrader(timeout=1.0, command=SCRIPTED)
    try:
        assert g("\\boxed{warm}", "warm") == Verdict(1.0, "\\boxed{warm}")
        assert g("\\boxed{hang}", "warm") == Verdict(0.0, None, "timeout")  # the limit is still the answer's
    finally:
        g.close()


def test_crashing_worker_scores_zero_with_error():
    g = MathGrader(timeout=5.0, command=CRASH)
    try:
        start = time.monotonic()
        assert g("\\boxed{1}", "1") == Verdict(0.0, None, "error")
        assert time.monotonic() - start < 5.0
        later = g("\\boxed{1}", "1")  # a fresh worker starts; it must not raise
        assert later.reward == 0.0 and later.failure == "error"
    finally:
        g.close()


def test_worker_that_never_starts_scores_error():
    """A worker that exits before "ready" (e.g. math-verify missing) is reported per call as
    failure "error", quickly and without raising; every call tries a fresh worker."""
    g = MathGrader(timeout=1.0, command=[sys.executable, "-c", "pass"])
    try:
        start = time.monotonic()
        assert [g("\\boxed{1}", "1") for _ in range(2)] == [Verdict(0.0, None, "error")] * 2
        assert time.monotonic() - start < 5.0
    finally:
        g.close()


def _in_thread(fn, *args):
    out = {}

    def run():
        try:
            out["value"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 - re-raised in the main thread
            out["error"] = e

    t = threading.Thread(target=run)
    t.start()
    t.join(timeout=30)
    assert not t.is_alive(), "grading from a thread did not return"
    if "error" in out:
        raise out["error"]
    return out["value"]


def test_grading_from_a_non_main_thread(grader):
    assert _in_thread(grader, "The answer is \\boxed{\\dfrac{1}{2}}.", "0.5") == Verdict(1.0, "1/2", "")
    assert _in_thread(grader, "\\boxed{\\frac{2}{1}}", "\\frac{1}{2}").reward == 0.0


def test_grading_from_several_threads_at_once(grader):
    results = [None] * 6

    def work(i):
        results[i] = grader(f"\\boxed{{{i}}}", str(i if i % 2 else i + 1))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert [v.reward for v in results] == [0.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    assert [v.answer for v in results] == [str(i) for i in range(6)]


def test_timeout_from_a_non_main_thread():
    g = MathGrader(timeout=0.5, command=HANG)
    try:
        start = time.monotonic()
        assert _in_thread(g, "\\boxed{1}", "1") == Verdict(0.0, None, "timeout")
        assert time.monotonic() - start < 5.0
    finally:
        g.close()


def test_real_worker_keeps_going_after_an_exception_in_grading(grader):
    """No model output was found that makes math-verify itself raise (its parse and verify catch
    every Exception). A non-string gold raises TypeError inside the worker's _math_verdict, which
    exercises the same except branch: the request scores 0 as "error", the same worker process
    answers the next request."""
    grader("\\boxed{1}", "1")
    pid = grader._proc.pid
    assert grader("\\boxed{1}", None) == Verdict(0.0, None, "error")
    assert grader._proc is not None and grader._proc.pid == pid  # not restarted: it kept going
    assert grader("\\boxed{7}", "7") == Verdict(1.0, "7", "")


# ----------------------------------------------------------------------------- batches

def _data_file(tmp_path, *golds: str) -> str:
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps({"question": f"q{i}", "answer": gold}) + "\n"
                            for i, gold in enumerate(golds)))
    return str(path)


def test_make_task_passes_the_grading_knobs(tmp_path):
    task = make_task(_data_file(tmp_path, "#### 72"), grade_timeout=2.0, grade_workers=3,
                     grade_budget=7.5)
    assert task.budget == 7.5 and [g.timeout for g in task.grader.graders] == [2.0] * 3
    assert all(g._proc is None for g in task.grader.graders)  # workers start on first use


def test_grade_batch_on_a_built_in_task_grades_in_order():
    items = [(Problem("Add 1+2", "3"), "<answer>3</answer>"), (Problem("Add 2+2", "4"), "<answer>5</answer>"),
             (Problem("Add 3+3", "6"), "6")]
    assert grade_batch(RunningSumTask(), items) == [Verdict(1.0, "3"), Verdict(0.0, "5"), Verdict(0.0)]


@pytest.mark.slow
def test_grade_batch_on_a_file_task_keeps_order_and_verdicts(tmp_path):
    task = FileTask(_data_file(tmp_path, "48 + 24 = 72\n#### 72", "\\frac{1}{2}", "\\text{(C)}"), workers=2)
    clips, half, choice = task.problems
    items = [(clips, "She sold 72 clips.\n#### 72"), (half, "so \\boxed{0.5}"),
             (choice, "\\boxed{\\text{(B)}}"), (clips, "I don't know."),
             (half, "<answer>x <answer>\\frac{1}{2}</answer>"), (choice, "The answer is \\boxed{C}"),
             (clips, "\\boxed{" + "7" * 5000 + "}"), (clips, "#### 70")]
    try:
        verdicts = grade_batch(task, items)
    finally:
        task.close()
    assert [v.reward for v in verdicts] == [1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0]
    assert all(v.failure == "" for v in verdicts)
    assert verdicts[0].answer == "72" and verdicts[7].answer == "70"
    assert verdicts[3] == verdicts[6] == Verdict(0.0, None, "")  # no answer; one past MATH_ANSWER_CHARS


@pytest.mark.slow
def test_budget_ends_a_batch_and_the_run_goes_on(tmp_path):
    """Two workers, 1 s: one takes 72, 70, then the second hang; the other hangs on the first;
    neither is free again before the budget is spent, so the last two are never sent."""
    task = FileTask(_data_file(tmp_path, "#### 72"), workers=2, budget=1.0)
    task.grader = MathGraderPool(timeout=10.0, workers=2, command=SCRIPTED)
    problem = task.problems[0]
    responses = ["\\boxed{72}", "\\boxed{hang}", "\\boxed{70}", "\\boxed{hang}", "\\boxed{72}", "\\boxed{70}"]
    try:
        task.grader.start()
        start = time.monotonic()
        verdicts = grade_batch(task, [(problem, r) for r in responses])  # the task's budget
        seconds = time.monotonic() - start
        right, wrong = Verdict(1.0, "\\boxed{72}"), Verdict(0.0, "\\boxed{70}")
        spent = Verdict(0.0, None, "budget")
        assert verdicts == [right, spent, wrong, spent, spent, spent]
        assert 0.9 <= seconds < 3.0
        assert all(g._proc is None for g in task.grader.graders)  # both hung workers were killed
        after = grade_batch(task, [(problem, "\\boxed{70}"), (problem, "\\boxed{72}")], budget=5.0)
        assert after == [wrong, right]
    finally:
        task.close()


@pytest.mark.slow
def test_pool_grades_in_parallel_and_close_kills_its_workers():
    pool = MathGraderPool(timeout=10.0, workers=4, command=SCRIPTED)
    try:
        pool.start()
        procs = [g._proc for g in pool.graders]
        start = time.monotonic()
        verdicts = pool.grade_all([("\\boxed{sleep}", "72")] * 4)
        seconds = time.monotonic() - start
    finally:
        pool.close()
    assert verdicts == [Verdict(0.0, "\\boxed{sleep}")] * 4
    assert seconds < 3.5  # 1 s each: one after another would take 4 s
    assert all(proc.poll() is not None for proc in procs)


def test_a_worker_imports_the_repository_wherever_the_trainer_started(tmp_path):
    """A worker runs its module of grading/ with sys.path starting at the repository, as `python
    train.py` does: a file in the working directory named like a module it imports (json.py here)
    does not replace it, and the worker says it is ready."""
    (tmp_path / "json.py").write_text("raise SystemExit('the working directory was on sys.path')\n")
    done = subprocess.run(module_command("grading.pool", "--math-worker", "4"), input="", cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[0]) == "ready"
