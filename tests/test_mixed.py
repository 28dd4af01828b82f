"""Mixed-domain runs (`--data a,b,c --data-weights ...`): the sources and their weights checked before
anything loads, the seeded per-prompt draw of a source (mixed.MixedStream) and its exact resume,
and per-domain metrics in training and eval, in one process on a random model; a mix on 2 ranks,
resumed, in the session's shared launch (tests/pair.py). The issue's mix, running sums and
countdown 0.5/0.5, is measured in docs/measured.md ("Mixed domains, killed and resumed"): 150
steps on 2 ranks, and the same run killed and resumed (its countdown split would cost this suite
3 s a run to build)."""
import json
import shutil
from collections import Counter
from pathlib import Path

import pytest
import torch

import config
import eval as evaluation
from grading import mixed
import pair
from helpers import metrics
import train
from rewards import DataError, Problem

FIXTURE = Path(__file__).parent / "fixtures" / "code_problems.jsonl"
SMALL_SUMS = Path(__file__).parent.parent / "examples" / "task_small_sums.py"
SMALL = ["--prompts-per-step", "4", "--group-size", "4", "--max-new-tokens", "24", "--eval-samples", "2",
         "--eval-k", "1,2", "--eval-problems", "2"]


@pytest.mark.parametrize("flags, message", [
    (["--data", "running_sum,countdown", "--data-weights", "1"], r"--data-weights 1: 1 weight\(s\) for the 2 sources"),
    (["--data", "running_sum,countdown", "--data-weights", "0.5,-0.5"], "-0.5 is not a share: every weight must be"),
    (["--data", "running_sum,countdown", "--data-weights", "0.5,nan"], "nan is not a share"),
    (["--data", "running_sum,countdown", "--data-weights", "0.5,half"], "'half' is not a number"),
    (["--data", "running_sum,countdown", "--data-weights", "0,0"], "every weight is 0, so no source would be sampled"),
    (["--data-weights", "1"], "--data-weights weighs the sources of a mixed run; --data running_sum is one source"),
    (["--data", "running_sum,,countdown"], "--data running_sum,,countdown: an empty source between commas"),
    (["--data", "running_sum,running_sum"], r"two sources have the same name \(running_sum, running_sum\)"),
    (["--data", f"countdown,{FIXTURE.parent}/mean.jsonl"], "a source named mean would log its reward as reward/mean"),
    (["--data", f"running_sum,{FIXTURE}", "--eval-data", str(FIXTURE)], "1 entries for the 2 sources of --data"),
    (["--data", f"running_sum,{FIXTURE}", "--eval-data", f"{FIXTURE},{FIXTURE}"],
     "--data running_sum is built in .* leave its --eval-data entry empty"),
    (["--data", f"running_sum,{FIXTURE}"],
     f"--data {FIXTURE} is data .* with no held-out split of its own: give --eval-data .* \\(one entry per source"),
    (["--data", "running_sum,countdown", "--reward", "r.py:f"], "--data running_sum,countdown is no data file"),
])
def test_sources_and_weights_are_checked_before_anything_loads(flags, message):
    with pytest.raises(DataError, match=message):
        config.validate(config.parse_config(flags), 1)


def stream(weights, seed=0):
    problems = [Problem(f"{d}{i}", "", d) for d in weights for i in range(5)]
    return mixed.MixedStream(problems, weights, seed)


def test_the_stream_draws_sources_by_weight_and_resumes_exactly():
    whole = stream({"a": 0.75, "b": 0.25, "c": 0.0})
    batches = [whole.get(16 * i, 16) for i in range(400)]
    drawn = Counter(p.domain for batch in batches for p in batch)
    assert drawn["c"] == 0 and abs(drawn["a"] / (16 * 400) - 0.75) < 0.02  # 6,400 draws: 5 standard errors
    a_order = [p.prompt for batch in batches for p in batch if p.domain == "a"]
    assert sorted(a_order[:5]) == ["a0", "a1", "a2", "a3", "a4"] and sorted(a_order[5:10]) == sorted(a_order[:5])
    cut = stream({"a": 0.75, "b": 0.25, "c": 0.0})
    for i in range(7):
        cut.get(16 * i, 16)
    resumed = stream({"a": 0.75, "b": 0.25, "c": 0.0})
    resumed.load(json.loads(json.dumps(cut.state())))  # what trainer_state.pt keeps
    assert [resumed.get(16 * i, 16) for i in range(7, 12)] == batches[7:12]
    assert stream({"a": 0.75, "b": 0.25}, seed=1).get(0, 16) != batches[0]  # the seed chooses the draws
    with pytest.raises(RuntimeError, match="asked for prompt 32, but it stands at 192"):
        resumed.get(32, 16)


# Prompts of each source in steps 1-3 of the run below (seed 0, weights 2:1:1, 4 prompts a step): the
# draws a resumed run must replay, and which a change of the draw would change.
DRAWN = [[3, 1, 0], [1, 1, 2], [1, 2, 1]]


@pytest.mark.slow
def test_a_mixed_run_logs_each_domain_and_resumes_with_the_same_draws(random_model_dir, tmp_path):
    # (countdown would do as well as SmallSums, but building its 20,000-problem split takes 3 s)
    flags = ["--model", random_model_dir, "--data", f"running_sum,{SMALL_SUMS}:SmallSums,{FIXTURE}",
             "--data-weights", "2,1,1", "--eval-data", f",,{FIXTURE}", "--max-steps", "3", "--eval-every", "2",
             "--save-every", "2", *SMALL]
    train.main([*flags, "--out", str(tmp_path / "whole")])
    train.main([*flags, "--out", str(tmp_path / "resumed"),
                "--resume", str(tmp_path / "whole" / "checkpoints" / "step-2")])
    whole, resumed = metrics(tmp_path / "whole"), metrics(tmp_path / "resumed")
    domains = ("running_sum", "task_small_sums", "code_problems")
    assert [x["step"] for x in whole] == [0, 1, 2, 3] and [x["step"] for x in resumed] == [3]
    drawn = [[row[f"prompts/{d}"] for d in domains] for row in whole[1:]]
    assert drawn == DRAWN and all(sum(n) == 4 for n in drawn)  # the seed's draws, which a resume must replay
    for row in whole[1:]:
        assert all((f"reward/{d}" in row) == (row[f"prompts/{d}"] > 0) for d in domains)
        # a random model writes no ```python block, and its code responses say so
        assert row.get("code/code_problems/no_program", 1.0) == 1.0 == row.get("code/no_program", 1.0)
    untimed = [{k: v for k, v in row.items() if not k.startswith("time/")} for row in whole[3:] + resumed]
    assert untimed[0] == untimed[1]
    # a checkpoint written before the stream's state had its own key kept a mixed stream as "mix"
    old = tmp_path / "old"
    shutil.copytree(tmp_path / "whole" / "checkpoints" / "step-2", old / "checkpoints" / "step-2")
    state = torch.load(old / "checkpoints" / "step-2" / "trainer_state.pt", weights_only=True)
    state["mix"] = state.pop("stream")
    torch.save(state, old / "checkpoints" / "step-2" / "trainer_state.pt")
    train.main([*flags, "--resume", str(old)])
    assert {k: v for k, v in metrics(old)[-1].items() if not k.startswith("time/")} == untimed[0]
    for row in whole[0], whole[2]:  # eval: 2 held-out problems of each source
        assert row["eval/accuracy"] == pytest.approx(sum(row[f"eval/{d}/accuracy"] for d in domains) / 3)
        assert {f"eval/{d}/pass@2" for d in domains} <= row.keys() and row["eval/code_problems/code/no_program"] == 1


def test_eval_reports_each_domain(tmp_path, capsys):
    def record(domain, rewards):
        samples = [{"response": "", "extracted": str(r), "reward": r, "correct": r >= 1, "failure": ""} for r in rewards]
        return evaluation.problem_record(Problem("q", "1", domain), samples, [1, 2], None)

    records = [record("math", [1.0, 0.0]), record("math", [1.0, 1.0]), record("code", [0.0, 0.0])]
    m = evaluation.summarize_domains(records, [1, 2])
    assert (m["eval/pass@1"], m["eval/math/pass@1"], m["eval/math/pass@2"], m["eval/code/pass@2"]) == (
        pytest.approx(0.5), 0.75, 1.0, 0.0)
    evaluation.write_results(tmp_path, 0, {"k": [1, 2]}, m, records, "3 problems")
    assert capsys.readouterr().out.split("\n")[5:10] == [
        "", "| domain | problems | accuracy | pass@1 | pass@2 |", "|---|---|---|---|---|",
        # math: its problems' accuracies 0.5 and 1 -> SE √(2 · 0.25² / 2) = 0.25; code's one problem has no SE
        "| math | 2 | 75.0% ± 25.0 | 75.0% ± 25.0 | 100.0% ± 0.0 |", "| code | 1 | 0.0% | 0.0% | 0.0% |"]


# 3 steps saving at step 2, and a run resumed from that checkpoint: its step 3 must be the other's
MIX = ["--data", f"running_sum,{SMALL_SUMS}:SmallSums", "--data-weights", "0.5,0.5", "--model", "{random_model}",
       *pair.SMALL, "--max-new-tokens", "24", "--max-steps", "3"]
pair.register("mixed-whole", [*MIX, "--save-every", "2"])
pair.register("mixed-resumed", [*MIX, "--resume", "{root}/mixed-whole/checkpoints/step-2"])


def test_on_two_ranks_a_resumed_run_draws_the_same_sources(two_rank_runs):
    whole, resumed = (metrics(pair.folder(two_rank_runs, f"mixed-{name}")) for name in ("whole", "resumed"))
    assert [x["step"] for x in whole] == [1, 2, 3] and [x["step"] for x in resumed] == [3]
    assert all(x["prompts/running_sum"] + x["prompts/task_small_sums"] == 4 for x in whole)
    untimed = [{k: v for k, v in x.items() if not k.startswith("time/")} for x in (whole[2], resumed[0])]
    assert untimed[0] == untimed[1]
