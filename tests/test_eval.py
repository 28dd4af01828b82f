"""eval.py: docs/math.md §6 metrics on hand-made cases, and the stand-alone CLI end to end."""
import json
import math
from pathlib import Path

import pytest

import eval as evaluation
import pair
from eval import majority, pass_at_k, problem_record, summarize
from rewards import Problem

ROOT = Path(__file__).resolve().parent.parent


def test_pass_at_k_spec_values():
    assert pass_at_k(4, 2, 1) == pytest.approx(0.5, abs=1e-12)
    assert pass_at_k(4, 2, 2) == pytest.approx(0.833333, abs=1e-6)
    assert pass_at_k(256, 3, 64) == pytest.approx(0.5797823066, abs=1e-10)
    # the estimator is 1 − C(n−c, k)/C(n, k)
    assert pass_at_k(10, 3, 4) == pytest.approx(1 - math.comb(7, 4) / math.comb(10, 4), abs=1e-12)
    assert pass_at_k(5, 0, 3) == 0.0 and pass_at_k(5, 3, 3) == 1.0


def samples(answers, rewards, failures=None):
    return [{"response": "", "answer": a, "reward": r, "failure": (failures or {}).get(i, ""),
             "length": 10 + i, "truncated": i == 3} for i, (a, r) in enumerate(zip(answers, rewards))]


def test_majority_vote_hand_cases():
    assert majority(samples(["5", "7", "7", None], [1, 0, 0, 0])) == ("7", 0)
    assert majority(samples(["3", "3", "4", "3"], [1, 1, 0, 1])) == ("3", 1)
    assert majority(samples(["a", "b", "b", "a"], [0, 1, 1, 0])) == ("a", 0)  # tie: first seen
    assert majority(samples([None, None], [0, 0])) == (None, 0.0)  # nobody answered


def test_summary_of_two_problems_by_hand():
    p1 = problem_record(Problem("q1", "7"), samples(["5", "7", "7", None], [1, 0, 0, 0]), [1, 2, 4], None)
    p2 = problem_record(Problem("q2", "3"), samples(["3", "3", "4", "3"], [1, 1, 0, 1], {2: "timeout"}), [1, 2, 4],
                        {"response": "", "answer": "3", "reward": 1.0, "failure": "", "length": 5, "truncated": False})
    m = summarize([p1, p2], [1, 2, 4])
    # p1: c = 1 of 4 -> pass@1 1/4, pass@2 1 − C(3,2)/C(4,2) = 1/2, pass@4 1; majority "7" is wrong
    # p2: c = 3 of 4 -> pass@1 3/4, pass@2 1 (n − c < k), pass@4 1; majority "3" is right
    assert m["eval/accuracy"] == pytest.approx((0.25 + 0.75) / 2)
    assert m["eval/pass@1"] == pytest.approx(0.5)
    assert m["eval/pass@2"] == pytest.approx((0.5 + 1) / 2)
    assert m["eval/pass@4"] == pytest.approx(1.0)
    assert m["eval/maj@4"] == pytest.approx(0.5)
    assert m["eval/greedy"] == pytest.approx(0.5)  # a problem without a greedy record counts as wrong
    assert m["eval/length"] == pytest.approx(11.5) and m["eval/truncated"] == pytest.approx(0.25)
    assert m["eval/grader_failures"] == 1.0


def run_eval(argv) -> tuple[dict, list[dict]]:
    evaluation.main(argv)
    out = Path(argv[argv.index("--out") + 1])
    summary = json.loads((out / "summary.json").read_text())
    return summary, [json.loads(x) for x in (out / "problems.jsonl").read_text().splitlines()]


def test_cli_on_the_shipped_model_writes_consistent_results(tmp_path):
    summary, records = run_eval(["--problems", "6", "-n", "4", "--k", "1,2,4", "--max-new-tokens", "80",
                                 "--out", str(tmp_path / "ev"), "--step", "3"])
    m, settings = summary["metrics"], summary["settings"]
    assert settings["model"].endswith("assets/tiny-running-sum") and settings["data"] == "running_sum"
    assert (settings["problems"], settings["n"], settings["temperature"], settings["greedy"]) == (6, 4, 1.0, True)
    assert len(records) == 6 and all(len(r["samples"]) == 4 for r in records)
    # the summary is recomputed here from the per-problem rows, independently of summarize()
    for k in (1, 2, 4):
        assert m[f"eval/pass@{k}"] == pytest.approx(sum(pass_at_k(4, r["correct"], k) for r in records) / 6)
    assert m["eval/accuracy"] == pytest.approx(sum(s["reward"] for r in records for s in r["samples"]) / 24)
    assert m["eval/greedy"] == pytest.approx(sum(r["greedy"]["reward"] for r in records) / 6)
    for r in records:  # the shipped grader's answers are the tag's integer
        assert r["correct"] == sum(s["answer"] == r["gold"] for s in r["samples"])
    assert list((tmp_path / "ev").glob("events.out.tfevents.*"))


def test_cli_markovian_eval_with_a_larger_chunk_cap(tmp_path):
    summary, records = run_eval(["--config", str(ROOT / "configs" / "tiny_delethink.yaml"), "--max-chunks", "3",
                                 "--problems", "4", "-n", "2", "--k", "1", "--no-greedy", "--out", str(tmp_path / "ev")])
    s = summary["settings"]
    assert (s["max_chunks"], s["carryover"], s["max_new_tokens"], s["greedy"]) == (3, 21, 32, False)
    budget = 32 + 2 * (32 - 21)
    lengths = [x["length"] for r in records for x in r["samples"]]
    assert max(lengths) <= budget
    assert all(x["length"] == budget for r in records for x in r["samples"] if x["truncated"])
    for x in (x for r in records for x in r["samples"]):  # a trace of L > C tokens took 1 + ⌈(L − 32) / 11⌉ chunks
        assert len(x.get("chunks", [x["response"]])) == 1 + max(0, -(-(x["length"] - 32) // 11))
        assert x["response"].endswith(x.get("chunks", [x["response"]])[-1])  # the grader read the tail
    assert any("chunks" in x for r in records for x in r["samples"])


def test_cli_errors_name_the_problem(tmp_path):
    with pytest.raises(SystemExit, match="nope.jsonl: no such file"):
        evaluation.main(["--data", str(tmp_path / "nope.jsonl")])
    with pytest.raises(SystemExit, match=r"eval_k=\[1, 8\]"):
        evaluation.main(["-n", "4", "--k", "1,8"])
    with pytest.raises(SystemExit, match="--algo 'ppo': unknown; choose one of grpo"):
        evaluation.main(["--algo", "ppo"])
    (tmp_path / "file").write_text("")  # a file where the output folder should go: found before sampling
    with pytest.raises(SystemExit, match="--out .*file/ev: cannot write there"):
        evaluation.main(["--out", str(tmp_path / "file" / "ev")])
    with pytest.raises(SystemExit, match="--model .*nope: no such folder"):
        evaluation.main(["--model", str(tmp_path / "nope")])


BENCHMARK = ["--data", str(ROOT / "tests" / "fixtures" / "math500.jsonl"), "-n", "3", "--k", "1,3",
             "--max-new-tokens", "16", "--batch-size", "6"]  # 2 problems per generate call: 3 batches
pair.register("eval-math500", BENCHMARK, program="eval")


def test_torchrun_eval_of_a_benchmark_file_matches_one_process(two_rank_runs, tmp_path):
    """math-verify grading inside 2 torchrun workers, and the ranks' records gathered in order:
    the same per-problem results as one process."""
    two_dir = pair.folder(two_rank_runs, "eval-math500")
    two = json.loads((two_dir / "summary.json").read_text())
    one, records = run_eval([*BENCHMARK, "--out", str(tmp_path / "one")])
    assert two["metrics"] == one["metrics"] and one["metrics"]["eval/grader_failures"] == 0
    assert (two_dir / "problems.jsonl").read_text() == (tmp_path / "one" / "problems.jsonl").read_text()
    assert [r["gold"] for r in records][:2] == ["\\frac{7}{12}", "3\\sqrt{2}"]
