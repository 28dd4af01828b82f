"""eval.py: docs/math.md §6 metrics on hand-made cases, and the stand-alone CLI end to end."""
import json
import math
import subprocess
import sys
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


def samples(answers, rewards, failures=None, correct=None):
    """Sample records; correct (the task's verdict of full marks): reward ≥ 1 unless given."""
    return [{"response": "", "extracted": a, "reward": r, "failure": (failures or {}).get(i, ""),
             "correct": r >= 1 if correct is None else correct[i], "length": 10 + i, "truncated": i == 3}
            for i, (a, r) in enumerate(zip(answers, rewards))]


def test_majority_vote_hand_cases():
    def vote(answers, rewards):
        answer, first = majority(samples(answers, rewards))
        return answer, first and first["reward"]
    assert vote(["5", "7", "7", None], [1, 0, 0, 0]) == ("7", 0)
    assert vote(["3", "3", "4", "3"], [1, 1, 0, 1]) == ("3", 1)
    assert vote(["a", "b", "b", "a"], [0, 1, 1, 0]) == ("a", 0)  # tie: first seen
    assert vote([None, None], [0, 0]) == (None, None)  # nobody answered


def test_pass_at_k_and_maj_count_correct_answers_not_fractional_rewards():
    """An environment's reward 1/k for a right answer at attempt k (examples/env_retry.py): samples
    rewarded 1, 0.5, 1/3, 0 whose last turns the task graded right, right, right, wrong -> 3 correct
    of 4: pass@1 = accuracy (avg@4 of correctness) 0.75 (int(sum(rewards)) made it 1 correct: 0.25),
    maj@4 on the right answer 1 (it was its first sample's reward, 0.5)."""
    record = problem_record(Problem("q", "4"), samples(["4", "4", "4", "5"], [0.5, 1, 1 / 3, 0],
                                                       correct=[True, True, True, False]), [1, 2], None)
    assert record["correct"] == 3 and record["pass@k"] == {"1": 0.75, "2": 1.0}
    metrics = summarize([record], [1, 2])
    assert metrics["eval/pass@1"] == metrics["eval/accuracy"] == 0.75 and metrics["eval/maj@4"] == 1.0


def test_summary_of_two_problems_by_hand():
    p1 = problem_record(Problem("q1", "7"), samples(["5", "7", "7", None], [1, 0, 0, 0]), [1, 2, 4], None)
    p2 = problem_record(Problem("q2", "3"), samples(["3", "3", "4", "3"], [1, 1, 0, 1], {2: "timeout"}), [1, 2, 4],
                        {"response": "", "extracted": "3", "reward": 1.0, "failure": "", "length": 5, "truncated": False})
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
        assert r["correct"] == sum(s["extracted"] == r["gold"] for s in r["samples"])
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
    with pytest.raises(SystemExit, match="--engine vllm samples train.py's rollouts .* add --engine hf"):
        evaluation.main(["--engine", "vllm"])  # a run's config.yaml may say so: eval.py says what to add


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


# ----------------------------------------------------------------------------- --responses: shapes and joins
# sums_ids.jsonl: three "Add" problems with id sum-a, sum-b, sum-c and idx 10, 11, 12 (not their positions),
# graded by the example reward (1 for the gold number in an <answer> tag) in one worker, not math-verify's.

SUMS_IDS = str(ROOT / "tests" / "fixtures" / "sums_ids.jsonl")
SUMS = str(ROOT / "examples" / "sums.jsonl")  # no id fields; its first golds are 115, 225, 83
REWARD = ["--reward", str(ROOT / "examples" / "reward_number.py") + ":closeness_batch"]


def grade_lines(tmp_path, data: str, lines: list[dict], *flags: str) -> tuple[dict, list[dict]]:
    """eval.py --responses on these lines: (summary, problems.jsonl rows)."""
    path = tmp_path / "responses.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return run_eval(["--data", data, "--responses", str(path), *flags, "--out", str(tmp_path / "ev")])


def rewards_by_problem(records: list[dict]) -> dict:
    return {(r["index"], r.get("id")): [s["reward"] for s in r["samples"]] for r in records}


def test_responses_one_a_line_by_index_digits_and_other_field_names(tmp_path):
    summary, records = grade_lines(tmp_path, SUMS_IDS, [
        {"index": 0, "response": "<answer>5</answer>"}, {"index": "1", "completion": "<answer>7</answer>"},
        {"index": 1, "output": "<answer>8</answer>"}], *REWARD, "--k", "1")
    assert rewards_by_problem(records) == {(0, "sum-a"): [1.0], (1, "sum-b"): [0.0, 1.0]}
    assert summary["metrics"]["eval/accuracy"] == pytest.approx((1 + 0.5) / 2)


def test_responses_lists_joined_by_idx_as_a_position(tmp_path):
    """idx is a position where the data rows have none; a list per line is n samples."""
    summary, records = grade_lines(tmp_path, SUMS, [
        {"idx": 0, "responses": ["<answer>115</answer>", "<answer>1</answer>", "<answer>115</answer>"]},
        {"idx": "2", "completions": ["<answer>83</answer>", "<answer>83</answer>", "<answer>0</answer>"]}],
        *REWARD, "--k", "1,3")
    assert rewards_by_problem(records) == {(0, None): [1.0, 0.0, 1.0], (2, None): [1.0, 1.0, 0.0]}
    assert summary["settings"]["n"] == 3 and summary["metrics"]["eval/pass@3"] == 1.0
    assert [r["majority_answer"] for r in records] == [None, None]  # closeness gives no answer to vote on


def test_responses_joined_by_a_shared_id_and_by_id_field(tmp_path):
    _, records = grade_lines(tmp_path, SUMS_IDS, [
        {"id": "sum-c", "idx": 0, "response": "<answer>10</answer>"},  # idx here is ignored: id joins
        {"id": "sum-a", "responses": ["<answer>5</answer>", "<answer>6</answer>"]}], *REWARD)
    assert rewards_by_problem(records) == {(0, "sum-a"): [1.0, 0.0], (2, "sum-c"): [1.0]}
    _, records = grade_lines(tmp_path, SUMS_IDS, [
        {"idx": 12, "index": 0, "response": "<answer>10</answer>"}, {"idx": "11", "response": "<answer>8</answer>"}],
        *REWARD, "--id-field", "idx")
    assert rewards_by_problem(records) == {(1, "11"): [1.0], (2, "12"): [1.0]}  # the id joined on is the id kept
    _, records = grade_lines(tmp_path, str(ROOT / "tests" / "fixtures" / "gt.jsonl"), [
        {"idx": 2, "response": "<answer>90</answer>"}, {"idx": 0, "response": "<answer>72</answer>"}], *REWARD)
    assert rewards_by_problem(records) == {(0, "0"): [1.0], (2, "2"): [1.0]}  # its rows' idx are their positions


@pytest.mark.parametrize("lines,message", [
    ([{"index": 0, "text": "x"}], r"responses\.jsonl:1: missing field: expected one of response, responses, "
                                  r"completion, completions, output, outputs; the line has index, text$"),
    ([{"index": 0, "response": "x"}, {"index": "x", "response": "y"}],
     r"responses\.jsonl:2: 'index' must be an integer from 0 to 499 \(a problem's position in --data running_sum, "
     r"from 0\), got 'x'; the line has index, response$"),
    ([{"index": 0, "responses": ["a", 1]}],
     r"responses\.jsonl:1: 'responses' must be a non-empty list of strings \(a problem's responses\), got "
     r"\['a', 1\]; the line has index, responses$"),
    ([{"index": 0, "completion": ["a"]}], r"responses\.jsonl:1: 'completion' must be a string, got list; the line has "
                                          r"completion, index$"),
    ([{"problem": 0, "response": "x"}], r"responses\.jsonl:1: missing field: expected index or idx \(the problem's "
                                        r"position in --data running_sum, from 0\), an id field that every row of "
                                        r"--data has \(id, idx, unique_id; its rows have none of them\), or --id-field "
                                        r"NAME; the line has problem, response$"),
])
def test_responses_refusals_name_line_field_and_fields(tmp_path, lines, message):
    with pytest.raises(SystemExit, match=message):
        grade_lines(tmp_path, "running_sum", lines)


@pytest.mark.parametrize("lines,flags,message", [
    ([{"idx": 0, "response": "x"}], [],
     r"responses\.jsonl:1: 'idx' may be a problem's position in --data .*sums_ids\.jsonl or its row's idx, and these "
     r"differ \(.*sums_ids\.jsonl:1, position 0, has idx 10\): give --id-field idx .*; the line has idx, response$"),
    ([{"id": "sum-a", "response": "x"}, {"index": 0, "response": "y"}], [],
     r"responses\.jsonl:2: missing field 'id', which joins each line to its problem \(chosen by line 1\); the line "
     r"has index, response$"),
    ([{"id": "sum-z", "response": "x"}], [],
     r"responses\.jsonl:1: 'id' must be the id of one of the 3 problems of --data .*sums_ids\.jsonl, got 'sum-z'; "
     r"the line has id, response$"),
    ([{"unique_id": "u", "response": "x"}], ["--id-field", "unique_id"],
     r"sums_ids\.jsonl:1: missing field 'unique_id', which joins --responses lines to the rows; the line has answer, "
     r"id, idx, prompt$"),
])
def test_responses_join_refusals(tmp_path, lines, flags, message):
    with pytest.raises(SystemExit, match=message):
        grade_lines(tmp_path, SUMS_IDS, lines, *REWARD, *flags)


def test_id_field_needs_responses_and_rows(tmp_path):
    with pytest.raises(SystemExit, match="--id-field id joins --responses lines to problems: give --responses FILE"):
        evaluation.main(["--data", SUMS_IDS, "--id-field", "id"])
    with pytest.raises(SystemExit, match="--id-field id: --data running_sum has no rows to join on"):
        grade_lines(tmp_path, "running_sum", [{"id": 0, "response": "x"}], "--id-field", "id")


def test_grading_given_responses_imports_no_torch(tmp_path):
    """eval.py --responses loads no model, so it imports neither torch nor transformers (they are most
    of a start-up: about 2 s and 1.3 s here); checked in a fresh interpreter, as a user runs it."""
    responses = tmp_path / "r.jsonl"
    responses.write_text("".join(json.dumps({"index": i, "response": f"<answer>{i}</answer>"}) + "\n"
                                 for i in range(3)))
    script = ("import sys, eval; eval.main(sys.argv[1:]); "
              "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", script, "--data", "running_sum", "--responses", str(responses),
                           "--problems", "3", "--out", str(tmp_path / "ev")], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
    assert len((tmp_path / "ev" / "problems.jsonl").read_text().splitlines()) == 3
