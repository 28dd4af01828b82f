"""MathGrader (math-verify in a worker process): answer-equivalence fixtures, time limits, crashes,
threads. The fixture pairs are in tests/fixtures/grader_pairs.jsonl, each verdict decided from the
mathematics before the grader was run."""
import json
import sys
import threading
import time
from pathlib import Path

import pytest

from rewards import FileTask, MathGrader, Verdict

FIXTURES = Path(__file__).resolve().parent / "fixtures"
HANG = [sys.executable, str(FIXTURES / "hang_worker.py")]
CRASH = [sys.executable, str(FIXTURES / "crash_worker.py")]


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


def test_file_task_grades_with_math_verify(tmp_path):
    path = tmp_path / "gsm.jsonl"
    path.write_text(json.dumps({"question": "How many?", "answer": "48 + 24 = 72\n#### 1,000"}) + "\n")
    task = FileTask(str(path), grade_timeout=10.0)
    try:
        problem = task.problems[0]
        assert task.grade(problem, "#### 1000").reward == 1.0
        assert task.grade(problem, "she has \\boxed{999}").reward == 0.0
    finally:
        task.grader.close()


def test_file_task_without_math_verify_fails_before_any_model_loads(tmp_path, monkeypatch):
    import rewards
    path = tmp_path / "gsm.jsonl"
    path.write_text(json.dumps({"question": "q", "answer": "#### 1"}) + "\n")
    monkeypatch.setattr(rewards.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(rewards.DataError, match="needs math-verify: pip install math-verify"):
        FileTask(str(path))


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


def test_timeout_counted_over_a_batch():
    g = MathGrader(timeout=0.3, command=HANG)
    try:
        verdicts = [g("\\boxed{1}", "1") for _ in range(3)]
    finally:
        g.close()
    assert sum(v.failure == "timeout" for v in verdicts) == 3
    assert sum(v.reward for v in verdicts) == 0.0


def test_real_worker_times_out_on_a_hanging_answer_then_recovers():
    """sympy never finishes on 10^{10^{10}} (found by probing; memory stays small meanwhile)."""
    g = MathGrader(timeout=1.0)
    try:
        g("\\boxed{1}", "1")  # start the worker outside the timed part
        start = time.monotonic()
        assert g("\\boxed{10^{10^{10}}}", "3") == Verdict(0.0, None, "timeout")
        assert time.monotonic() - start < 5.0
        g.timeout = 10.0  # the fresh worker's first answer is not the thing under test
        assert g("The answer is \\boxed{7}.", "7").reward == 1.0
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
