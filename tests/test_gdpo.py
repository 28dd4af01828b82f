"""Several reward terms (--reward-terms, grading/terms.py) and GDPO (--algo gdpo, algos/gdpo.py): docs/math.md §9's
worked example, a one-term gdpo run that is GRPO at GDPO's eps, 1 and 2 ranks, every term's curve in
metrics.jsonl and TensorBoard, bad input said before anything loads, and a term that fails mid-run."""
from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import pytest
import torch

import algos
import pair
import train
from algos import gdpo, policy_gradient
from config import Config
from grading.terms import Term, Weighted, parse_terms
from rewards import Problem
from rollout import Episode
from tasks import RunningSumTask

from helpers import metrics, run_main, same_run, share_two_ranks

# docs/math.md §9: two groups of G = 4, correctness c and format f. Group B: c = [1, 0, 0, 0], f = [1, 0, 0, 0];
# group A: c = [0, 0, 0, 0], f = [1, 0, 0, 0].
C = [[1, 0, 0, 0], [0, 0, 0, 0]]
F = [[1, 0, 0, 0], [1, 0, 0, 0]]
EXPECTED = {  # the advantages, group B then group A
    (1.0, 1.0): [2.0492501, -0.6830834, -0.6830834, -0.6830834, 1.0246251, -0.3415417, -0.3415417, -0.3415417],
    (1.0, 0.5): [2.1734965, -0.7244988, -0.7244988, -0.7244988, 0.7244988, -0.2414996, -0.2414996, -0.2414996],
}
SUMMED = [1.4998500, -0.4999500, -0.4999500, -0.4999500, 1.4997001, -0.4999000, -0.4999000, -0.4999000]
FORMAT = "def format(prompt, response, answer):\n    return 1.0\n"  # the term's file; its values are set by hand


def worked(tmp_path, weights) -> tuple[torch.Tensor, Config, list[Episode]]:
    """(the summed scores [2, 4], a config of the two terms at these weights, the 8 episodes with their values)."""
    (Path(tmp_path) / "fmt.py").write_text(FORMAT)
    cfg = Config(algo="gdpo", group_size=4, reward_terms=f"correct={weights[0]},{tmp_path}/fmt.py:format={weights[1]}")
    episodes = []
    for c, f in zip(sum(C, []), sum(F, [])):
        e = Episode([1], [2], "", False, 0, Problem("p", "1"))
        e.details = {"reward/correct": float(c), "reward/format": float(f)}
        e.score = weights[0] * c + weights[1] * f
        episodes.append(e)
    return torch.tensor([e.score for e in episodes], dtype=torch.float64).view(2, 4), cfg, episodes


@pytest.mark.parametrize("weights", list(EXPECTED))
def test_gdpo_equals_the_spec_worked_example(tmp_path, weights):
    """Each term normalised in its group (Bessel's std + 1e-4; group A's correctness, all 0, gives 0), summed
    with the weights, normalised over the batch: docs/math.md §9's advantages to 1e-6, through train.set_advantages as
    a step computes them. The summed reward under GDPO's one-term normalisation gives the right-and-formatted
    response of group B what group A's merely formatted one gets (to 2e-4), and GDPO tells them apart by 1.02."""
    scores, cfg, episodes = worked(tmp_path, weights)
    train.set_advantages(episodes, algo=algos.get("gdpo"), cfg=cfg)
    assert [e.advantage for e in episodes] == pytest.approx(EXPECTED[weights], abs=1e-6)
    if weights == (1.0, 1.0):
        one = Config(algo="gdpo", group_size=4)  # one term: the summed score, group-normalised at eps 1e-4
        summed = gdpo.advantages(scores, one, episodes).flatten().tolist()
        assert summed == pytest.approx(SUMMED, abs=1e-6)
        assert abs(summed[0] - summed[4]) < 2e-4 and EXPECTED[weights][0] - EXPECTED[weights][4] > 1.0


def on_two_ranks(rank, world, dirs) -> dict:
    """The worked example split over 2 ranks as a step holds it (rank 0 group B, rank 1 group A), gathered as
    train.collect_rollouts gathers, then train.set_advantages: every rank's advantages, for each weighting."""
    from parallel import gather_objects

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for weights in EXPECTED:
            _, cfg, episodes = worked(tmp, weights)
            mine = episodes[4 * rank:4 * rank + 4]
            gathered = [e for part in gather_objects(mine, world) for e in part]
            train.set_advantages(gathered, algo=algos.get("gdpo"), cfg=cfg)
            out[weights] = gather_objects([e.advantage for e in gathered], world)
    return out


share_two_ranks("gdpo", on_two_ranks)


@pytest.mark.slow
def test_the_batch_normalisation_spans_two_ranks(spawned_ranks):
    """On 2 ranks, each holding one group, both ranks compute docs/math.md §9's advantages of the whole batch (the
    batch mean and std are over both groups: rank 1's group A alone would be normalised to other numbers)."""
    for weights, per_rank in spawned_ranks["gdpo"].items():
        assert len(per_rank) == 2
        for advantages in per_rank:
            assert advantages == pytest.approx(EXPECTED[weights], abs=1e-6)


def test_one_term_is_grpo_at_gdpos_eps():
    """With one term the official code applies no GDPO: gdpo's advantages are GRPO's group normalisation
    (unbiased std) at eps 1e-4, equal to `--algo grpo --adv-eps 1e-4`'s, and not to GRPO's default eps's."""
    scores = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.3, 0.3, 0.3, 0.3], [0.0, 0.5, 1.0, 0.25]], dtype=torch.float64)
    ours = gdpo.advantages(scores, Config(algo="gdpo"), [])
    assert torch.equal(ours, policy_gradient.batch_advantages(scores, Config(adv_eps=1e-4)))
    assert not torch.equal(ours, policy_gradient.batch_advantages(scores, Config()))


def test_parse_terms_reads_names_weights_and_functions(tmp_path):
    (tmp_path / "fmt.py").write_text(FORMAT)
    assert parse_terms(f"correct, {tmp_path}/fmt.py:format=0.25") == [
        Term("correct", 1.0), Term("format", 0.25, f"{tmp_path}/fmt.py:format")]


def test_the_weighted_task_sums_the_terms_and_keeps_each(tmp_path):
    """A Weighted task's Verdict: reward Σ w_j r_j, the task's answer and failure, each term under reward/<name>,
    a term that raises or returns nan scored 0 and counted (a count over the batch, as training and eval log it:
    tasks.detail_means); eval's `correct` stays the task's own verdict."""
    from eval import sample_record
    from tasks import detail_means

    (tmp_path / "terms.py").write_text(
        "def brevity(prompt, response, answer):\n    return 1.0 - len(response) / 100\n"
        "def picky(prompt, response, answer):\n"
        "    if 'boom' in response:\n        raise RuntimeError('boom')\n"
        "    return float('nan') if 'nan' in response else 0.5\n")
    task = Weighted(RunningSumTask(), parse_terms(f"correct=1,{tmp_path}/terms.py:brevity=0.5,"
                                                  f"{tmp_path}/terms.py:picky=2"), timeout=10, workers=1)
    try:
        right, boom, nan = ("<answer>3</answer>", "boom <answer>4</answer>", "nan <answer>3</answer>")
        verdicts = task.grade_batch([(Problem("Add 1+2", "3"), r) for r in (right, boom, nan)], 0.0)
        stats = task.stats([Episode([1], [2], "", False, 0, Problem("p", "3"), details=v.details) for v in verdicts], 3)
    finally:
        task.close()
    assert [v.reward for v in verdicts] == pytest.approx(
        [1 + 0.5 * (1 - 18 / 100) + 2 * 0.5, 0.5 * (1 - 23 / 100), 1 + 0.5 * (1 - 22 / 100)])
    assert [v.answer for v in verdicts] == ["3", "4", "3"]
    assert [v.details["reward/picky_failures"] for v in verdicts] == [0.0, 1.0, 1.0]
    assert [v.details["reward/picky"] for v in verdicts] == [0.5, 0.0, 0.0]
    assert stats == {}  # the task's own: running sums have none
    counted = detail_means([v.details for v in verdicts])
    assert counted["reward/brevity_failures"] == 0.0 and counted["reward/picky_failures"] == 2.0
    assert counted["reward/picky"] == pytest.approx(0.5 / 3)  # a term's value is still its mean
    assert [sample_record("", v)["correct"] for v in verdicts] == [True, False, True]  # totals 2.41, 0.385, 1.39


@pytest.mark.parametrize("flags,said", [
    (["--reward-terms", "correct,style"], "unknown term 'style'"),
    (["--reward-terms", "correct=-1"], "the weight of 'correct' is '-1'"),
    (["--reward-terms", "correct=nan"], "the weight of 'correct' is 'nan'"),
    (["--reward-terms", "correct=inf"], "the weight of 'correct' is 'inf'"),
    (["--reward-terms", "correct=1,examples/brevity.py:shortness"], "has no top-level function shortness"),
    (["--reward-terms", "correct=1,nowhere.py:brevity"], "no such file nowhere.py"),
    (["--reward-terms", "correct,correct=2"], "two terms named correct"),
    (["--algo", "gdpo", "--reward-terms", "correct=1,examples/brevity.py:brevity", "--overlong-penalty", "true"],
     "--algo gdpo normalises each reward term apart, and overlong_penalty"),
])
def test_bad_terms_are_one_line_before_anything_loads(tmp_path, monkeypatch, flags, said):
    def load_model(*args, **kwargs):
        raise AssertionError("weights loaded before the check")

    monkeypatch.setattr(train, "load_model", load_model)
    message = run_main([*flags, "--max-steps", "1", "--out", str(tmp_path / "run")])
    assert message.startswith("error: ") and said in message and "\n" not in message, message


TERMS = ["--reward-terms", "correct=1,examples/brevity.py:brevity=0.5"]
SMALL = ["--max-steps", "2", "--prompts-per-step", "4", "--group-size", "4", "--eval-every", "2", "--eval-problems",
         "8", "--max-new-tokens", "80"]
pair.register("gdpo-two-ranks", ["--algo", "gdpo", *TERMS, *SMALL])


@pytest.mark.slow
def test_gdpo_runs_on_one_and_two_ranks_and_logs_every_term(two_rank_runs, tmp_path, one_thread):
    """--algo gdpo with correctness and brevity, 2 steps and an eval, on one rank and on two: every term's batch
    mean is in metrics.jsonl (the weighted total is reward/mean) and in TensorBoard (read back with its own
    reader), in eval too (eval/reward/correct is eval's accuracy), and per response in samples.jsonl."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "one"
    train.main(["--algo", "gdpo", *TERMS, *SMALL, "--out", str(out)])
    one, two = metrics(out), metrics(pair.folder(two_rank_runs, "gdpo-two-ranks"))
    steps = [row for row in one if row["step"] >= 1]
    for row in steps + [row for row in two if row["step"] >= 1]:
        assert {"reward/correct", "reward/brevity", "reward/brevity_failures"} <= set(row)
        assert 0 < row["reward/brevity"] < 1 and row["reward/brevity_failures"] == 0
        assert row["reward/mean"] == pytest.approx(row["reward/correct"] + 0.5 * row["reward/brevity"], abs=2e-6)
    assert "eval/reward/brevity" in steps[-1] and steps[-1]["eval/reward/correct"] == steps[-1]["eval/accuracy"]
    board = EventAccumulator(str(out))  # the run folder holds its event files
    board.Reload()
    for key in ("reward/correct", "reward/brevity"):
        assert [round(e.value, 5) for e in board.Scalars(key)] == [round(row[key], 5) for row in steps]
    for sample in map(json.loads, (out / "samples.jsonl").read_text().splitlines()):
        d = sample["details"]
        assert sample["reward"] == pytest.approx(d["reward/correct"] + 0.5 * d["reward/brevity"])
        assert d["reward/brevity"] == pytest.approx(max(0.0, 1 - len(sample["response"]) / 100))


@pytest.mark.slow
def test_a_one_term_gdpo_run_is_grpo_at_gdpos_eps(tmp_path, one_thread):
    """`--algo gdpo` without terms and `--algo grpo --adv-eps 1e-4` log the same numbers, step for step."""
    runs = {}
    for name, flags in (("gdpo", ["--algo", "gdpo"]), ("grpo", ["--algo", "grpo", "--adv-eps", "1e-4"])):
        train.main([*flags, *SMALL, "--eval-every", "0", "--out", str(tmp_path / name)])
        runs[name] = metrics(tmp_path / name)
    assert same_run(runs["gdpo"], runs["grpo"]) and math.isfinite(runs["gdpo"][-1]["loss/total"])


@pytest.mark.slow
def test_a_term_that_fails_mid_run_is_named_scored_0_and_the_run_goes_on(tmp_path, one_thread):
    """A term that raises on some responses and returns nan on others: those score 0 for it, are counted in
    reward/<name>_failures, and the run finishes its steps."""
    (tmp_path / "flaky.py").write_text(
        "def flaky(prompt, response, answer):\n"
        "    if len(response) % 3 == 0:\n        raise ValueError('no')\n"
        "    return float('nan') if len(response) % 3 == 1 else 1.0\n")
    out = tmp_path / "run"
    train.main(["--reward-terms", f"correct=1,{tmp_path}/flaky.py:flaky=1", *SMALL, "--eval-every", "0",
                "--out", str(out)])
    rows = metrics(out)
    assert [r["step"] for r in rows] == [1, 2]
    samples = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    for s in samples:
        failed = len(s["response"]) % 3 != 2
        assert s["details"]["reward/flaky_failures"] == float(failed)
        assert s["details"]["reward/flaky"] == (0.0 if failed else 1.0)
    assert all(r["reward/flaky_failures"] > 0 for r in rows)


def test_a_failing_term_is_said_once_counted_per_step_and_stops_the_run_when_it_always_fails(tmp_path, capsys):
    """Issue 74: its first failure's text on stderr once (not at each batch), the step's count in one line, the
    same count in eval's metric as in training's; failing on every response of ALL_FAILED_STEPS steps stops."""
    from eval import summarize
    from grading.terms import ALL_FAILED_STEPS
    from rollout import RolloutError
    from tasks import detail_means

    (tmp_path / "bug.py").write_text("def bug(prompt, response, answer):\n    raise ValueError('term bug 42')\n")
    task = Weighted(RunningSumTask(), parse_terms(f"correct=1,{tmp_path}/bug.py:bug"), timeout=10, workers=1)
    items = [(Problem("Add 1+2", "3"), r) for r in ("<answer>3</answer>", "<answer>4</answer>")] * 3
    try:
        steps = []
        for _ in range(ALL_FAILED_STEPS - 1):
            verdicts = task.grade_batch(items, 0.0)
            steps.append([Episode([1], [2], "", False, 0, Problem("p", "3"), details=v.details) for v in verdicts])
            task.stats(steps[-1], 2)
        err = capsys.readouterr().err
        assert err.count("term bug 42") == 1 and "failed: error: ValueError: term bug 42" in err, err
        assert err.count("reward terms failed: bug on 6 of 6 responses") == ALL_FAILED_STEPS - 1, err
        with pytest.raises(RolloutError, match=f"failed on every response of {ALL_FAILED_STEPS} steps in a row"):
            task.stats(steps[-1], 2)
    finally:
        task.close()
    samples = [{"correct": False, "details": v.details, "failure": ""} for v in verdicts]
    records = [{"samples": samples[i:i + 2], "correct": 0, "pass@k": {"1": 0.0}, "majority_correct": False,
                "greedy": None} for i in range(0, 6, 2)]
    assert summarize(records, [1])["eval/reward/bug_failures"] == 6.0  # a count, as in training (not 1.0)
    assert detail_means([e.details for e in steps[-1]])["reward/bug_failures"] == 6.0


def test_gdpo_with_fewer_than_two_terms_says_it_is_grpo(capsys):
    from config import parse_config, validate

    validate(parse_config(["--algo", "gdpo"]), world=1)
    assert "warning: --algo gdpo with no reward term(s) normalises one reward" in capsys.readouterr().err
    validate(parse_config(["--algo", "gdpo", "--reward-terms", "correct=1,examples/brevity.py:brevity=0.5"]), world=1)
    assert "warning" not in capsys.readouterr().err
