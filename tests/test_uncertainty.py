"""How sure an eval is (docs/math.md §6.1-6.3): standard errors over problems, paired differences,
their coverage in simulation, eval.py --compare, extras/seeds.py's summary over seeds and the plot's band."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

import eval as evaluation
from eval import pass_at_k, paired, per_problem, problem_record, standard_error, summarize
from extras import plot, seeds
from rewards import Problem


def test_standard_error_by_hand():
    # [1, 0, 1, 1]: mean 3/4, squared deviations 1/16 · 3 + 9/16 = 3/4, / (4 · 3) = 1/16 -> 1/4
    assert standard_error([1, 0, 1, 1]) == pytest.approx(0.25, abs=1e-12)
    assert standard_error([0.75, 0.25]) == pytest.approx(0.25, abs=1e-12)
    assert standard_error([0.5, 0.5, 0.5]) == 0.0
    assert standard_error([0.7]) is None and standard_error([]) is None  # no spread from one problem


def sample(correct: bool, answer: str) -> dict:
    return {"response": "", "extracted": answer, "reward": float(correct), "correct": correct, "failure": "",
            "length": 10, "truncated": False}


def test_se_of_avg_pass_and_maj_by_hand():
    """Three problems, n = 4 (docs/math.md §6.1's worked example): correct 1, 2, 4 of 4.
    avg@4 per problem 1/4, 1/2, 1 -> mean 7/12, SE √(Σ(x − 7/12)² / (3 · 2)) = √(0.291667 / 6) = 0.220479;
    pass@2 per problem 1/2, 5/6, 1 -> mean 7/9, SE √((0.077160 + 0.003086 + 0.049383) / 6) = 0.146986;
    maj@4 1 (a tie "9"/"1" goes to "9", seen first), 0 (a tie "2"/"9" goes to "2"), 1 -> mean 2/3,
    SE √((1/9 + 4/9 + 1/9) / 6) = 1/3."""
    gold = Problem("q", "9")
    rows = [problem_record(gold, [sample(True, "9"), sample(False, "1"), sample(False, None), sample(False, None)],
                           [1, 2], None),  # votes 9:1, 1:1 -> "9", seen first
            problem_record(gold, [sample(False, "2"), sample(True, "9"), sample(True, "9"), sample(False, "2")],
                           [1, 2], None),
            problem_record(gold, [sample(True, "9")] * 4, [1, 2], None)]
    assert [r["accuracy"] for r in rows] == [0.25, 0.5, 1.0]
    m = summarize(rows, [1, 2])
    assert m["eval/accuracy"] == pytest.approx(7 / 12) and m["eval/accuracy_se"] == pytest.approx(0.220479, abs=1e-6)
    assert m["eval/pass@1_se"] == pytest.approx(0.220479, abs=1e-6)
    assert m["eval/pass@2"] == pytest.approx(7 / 9) and m["eval/pass@2_se"] == pytest.approx(0.146986, abs=1e-6)
    assert m["eval/maj@4"] == pytest.approx(2 / 3) and m["eval/maj@4_se"] == pytest.approx(1 / 3, abs=1e-6)
    assert "eval/greedy_se" not in m and "eval/length_se" not in m  # no greedy here; a length is no proportion
    assert per_problem(rows, [1, 2])["maj@4"] == [1.0, 0.0, 1.0]


def test_paired_difference_by_hand():
    """docs/math.md §6.2's example: a = [1, 0, 1, 0.5], b = [1, 0.5, 1, 1]. Differences 0, 0.5, 0, 0.5: mean
    0.25, SE √(0.25 / 12) = 0.144338; SE_a = √(0.6875 / 12) = 0.239357, SE_b = √(0.1875 / 12) = 0.125,
    unpaired √(0.0572917 + 0.015625) = 0.270031; pairing removes 1 − 0.0208333 / 0.0729167 = 5/7 of the variance."""
    r = paired([1, 0, 1, 0.5], [1, 0.5, 1, 1])
    assert (r["a"], r["b"], r["diff"]) == (0.625, 0.875, 0.25)
    assert r["se"] == pytest.approx(0.144338, abs=1e-6) and r["se_unpaired"] == pytest.approx(0.270031, abs=1e-6)
    assert (r["low"], r["high"]) == pytest.approx((0.25 - 1.96 * 0.1443376, 0.25 + 1.96 * 0.1443376), abs=1e-6)
    assert r["variance_cut"] == pytest.approx(5 / 7, abs=1e-6)


def covered(estimates: list[tuple[float, float]], truth: float) -> float:
    """The share of (estimate, SE) pairs whose 95% interval holds the truth."""
    return sum(abs(mean - truth) <= 1.96 * se for mean, se in estimates) / len(estimates)


def test_intervals_cover_the_population_mean_95_percent_of_the_time():
    """A known population of 5,000 problems whose accuracies are spread as a small model's are (many near 0
    or 1); 2,000 simulated evals each draw 200 problems from it and 4 samples of each (8 for pass@4). The
    interval mean ± 1.96 SE covers the population's avg@n and pass@4 (1 − (1 − p)⁴ averaged: what the unbiased
    estimator estimates) in 93.5-96.5% of the evals, and the paired interval covers the population's difference
    between two models whose accuracies are correlated problem by problem."""
    rng = np.random.default_rng(20261129)
    population = np.clip(rng.beta(0.7, 0.5, 5000), 0.001, 0.999)
    better = 1 / (1 + np.exp(-(np.log(population / (1 - population)) + 0.4)))  # B: A's log-odds + 0.4
    truth = {"avg": population.mean(), "pass@4": (1 - (1 - population) ** 4).mean(), "diff": (better - population).mean()}
    avg, at4, diff = [], [], []
    for _ in range(2000):
        problems = rng.integers(0, len(population), 200)
        a, b = rng.binomial(4, population[problems]) / 4, rng.binomial(4, better[problems]) / 4
        c8 = rng.binomial(8, population[problems])
        avg.append((a.mean(), standard_error(a.tolist())))
        at4_values = [pass_at_k(8, int(c), 4) for c in c8]
        at4.append((sum(at4_values) / 200, standard_error(at4_values)))
        r = paired(a.tolist(), b.tolist())
        diff.append((r["diff"], r["se"]))
    shares = {"avg": covered(avg, truth["avg"]), "pass@4": covered(at4, truth["pass@4"]),
              "diff": covered(diff, truth["diff"])}
    assert all(0.935 <= share <= 0.965 for share in shares.values()), shares
    # and the pairing is worth having here: the paired SE is well below the unpaired one
    assert np.mean([paired(*(rng.binomial(4, population[:200]) / 4, rng.binomial(4, better[:200]) / 4))["variance_cut"]
                    for _ in range(20)]) > 0.3


def an_eval(path, golds: list[str], correct: list[list[bool]], ids: bool = False):
    """A problems.jsonl of problems whose responses are right or wrong as `correct` says."""
    rows = [problem_record(Problem(f"q{i}", gold, id=f"id{i}" if ids else None),
                           [sample(c, gold if c else "x") for c in row], [1, 2], None)
            for i, (gold, row) in enumerate(zip(golds, correct))]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def test_compare_pairs_problems_and_refuses_different_sets(tmp_path, capsys):
    T, F = True, False
    an_eval(tmp_path / "a.jsonl", ["1", "2", "3", "4"], [[T, T], [F, F], [T, T], [T, F]], ids=True)
    an_eval(tmp_path / "b.jsonl", ["1", "2", "3", "4"], [[T, T], [T, F], [T, T], [T, T]], ids=True)
    text, results = evaluation.compared(str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl"))
    assert results["accuracy"]["diff"] == 0.25 and results["accuracy"]["se"] == pytest.approx(0.144338, abs=1e-6)
    assert "| accuracy | 62.5% ± 23.9 | 87.5% ± 12.5 | +25.0 | [-3.3, +53.3] | 14.4 | 27.0 | 71% |" in text
    # the same problems in another order: matched by id, the same result
    lines = (tmp_path / "b.jsonl").read_text().splitlines()
    (tmp_path / "b2.jsonl").write_text("\n".join(lines[::-1]) + "\n")
    assert evaluation.compared(str(tmp_path / "a.jsonl"), str(tmp_path / "b2.jsonl"))[1] == results
    # one problem more in B: refused, saying how the sets differ
    an_eval(tmp_path / "c.jsonl", ["1", "2", "3", "4", "5"], [[T, T]] * 5, ids=True)
    with pytest.raises(ValueError, match=r"evals of different problems: 4 and 5 problems, 0 only in the first, "
                                         r"1 only in the second \(e.g. \('id', 'id4'\)\)"):
        evaluation.compared(str(tmp_path / "a.jsonl"), str(tmp_path / "c.jsonl"))
    # the command: one line for a mistake, the table otherwise
    with pytest.raises(SystemExit, match=r"^error: .*nowhere: no such file or folder$"):
        evaluation.main(["--compare", str(tmp_path / "a.jsonl"), str(tmp_path / "nowhere")])
    (tmp_path / "bad.jsonl").write_text('{"prompt": "q"}\n')
    with pytest.raises(SystemExit, match=r"bad.jsonl:1: not a problem's row as eval.py writes them"):
        evaluation.main(["--compare", str(tmp_path / "a.jsonl"), str(tmp_path / "bad.jsonl")])
    run = tmp_path / "run"
    (run / "evals").mkdir(parents=True)
    (run / "evals" / "step-0.jsonl").write_text("")
    with pytest.raises(SystemExit, match=r"a training run; compare one of its evals, .*/evals/step-N.jsonl \(N: 0\)"):
        evaluation.main(["--compare", str(run), str(tmp_path / "a.jsonl")])
    with pytest.raises(SystemExit, match="--compare reads two written evals; drop --lr 1"):
        evaluation.main(["--compare", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl"), "--lr", "1"])
    evaluation.main(["--compare", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")])
    assert "| maj@2 |" in capsys.readouterr().out


def test_over_seeds_by_hand(tmp_path):
    """Three runs: step-25 eval/accuracy 0.70, 0.74, 0.78 (their own SEs 0.03, 0.03, 0.024): mean 0.74, SE over
    seeds √(0.0032 / 2 / 3) = 0.023094, a run's SE 0.028; reward/mean at step 1 from two runs only is left out."""
    runs = [{0: {"eval/accuracy": 0.5, "eval/accuracy_se": 0.03}, 25: {"eval/accuracy": x, "eval/accuracy_se": e}}
            for x, e in ((0.70, 0.03), (0.74, 0.03), (0.78, 0.024))]
    runs[0][1] = runs[1][1] = {"reward/mean": 0.5}
    rows = seeds.over_seeds(runs)
    assert [r["step"] for r in rows] == [0, 25]
    assert rows[1]["eval/accuracy"] == pytest.approx(0.74)
    assert rows[1]["eval/accuracy_se"] == pytest.approx(0.023094, abs=1e-6)
    assert rows[1]["eval/accuracy_run_se"] == pytest.approx(0.028)
    assert rows[0]["eval/accuracy_se"] == 0.0
    assert seeds.mean_and_se([0.80, 0.78, 0.82]) == pytest.approx((0.80, 0.011547), abs=1e-6)
    assert seeds.mean_and_se([0.8]) == (0.8, None)
    assert "| 25 | 74.0 ± 2.3 [2.8] |" in seeds.table(rows, 3)
    # the summary of run folders, as the command writes it
    folders = []
    for i, run in enumerate(runs):
        folders.append(tmp_path / f"seed-{i}")
        folders[-1].mkdir()
        (folders[-1] / "metrics.jsonl").write_text("".join(json.dumps({"step": s, **row}) + "\n" for s, row in run.items()))
    seeds.main([str(f) for f in folders] + ["--out", str(tmp_path)])
    written = [json.loads(x) for x in (tmp_path / "summary" / "metrics.jsonl").read_text().splitlines()]
    assert written == [json.loads(json.dumps(r)) for r in rows]
    assert seeds.finished(folders[0], 25) and not seeds.finished(folders[0], 150)


def test_seeds_command_refusals(tmp_path):
    with pytest.raises(SystemExit, match="give run folders to summarise, or --seeds"):
        seeds.main([])
    with pytest.raises(SystemExit, match="--seeds runs a sweep into --out DIR"):
        seeds.main(["--seeds", "0,1"])
    with pytest.raises(SystemExit, match="--seeds 0,0: a seed given twice"):
        seeds.main(["--seeds", "0,0", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="no metrics.jsonl here"):
        seeds.main([str(tmp_path / "nowhere")])
    with pytest.raises(SystemExit, match=r"^error: lr=-1.0"):  # train.py's own check of its flags, before any run starts
        seeds.main(["--seeds", "0", "--out", str(tmp_path / "s"), "--", "--lr", "-1"])
    assert not (tmp_path / "s").exists()


def test_plot_draws_an_se_as_its_metrics_band_not_as_a_panel(tmp_path):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "eval/accuracy": 0.5, "eval/accuracy_se": 0.02, "eval/pass@4": 0.8,
                            "eval/pass@4_se": 0.01, "eval/pass@4_run_se": 0.03}) + "\n" for s in (0, 25)))
    runs = plot.read_runs([str(tmp_path / "r")])
    assert plot.chosen_keys(["eval/*"], runs) == ["eval/accuracy", "eval/pass@4"]
    assert plot.chosen_keys(["eval/pass@4_se"], runs) == ["eval/pass@4_se"]  # named: drawn as asked


@pytest.mark.needs("matplotlib")
def test_the_band_is_drawn(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    rows = [{"step": s, "eval/accuracy": 0.5 + 0.01 * s, "eval/accuracy_se": 0.02} for s in (0, 25, 50)]
    seen = {}
    original = plt.Axes.fill_between

    def spy(ax, x, low, high, **kw):
        seen.update(x=list(x), low=list(low), high=list(high))
        return original(ax, x, low, high, **kw)

    plt.Axes.fill_between = spy
    try:
        plot.draw({"r": rows}, ["eval/accuracy"], tmp_path / "band.png")
    finally:
        plt.Axes.fill_between = original
    assert seen["x"] == [0, 25, 50]
    assert seen["low"] == pytest.approx([0.5 - 0.0392, 0.75 - 0.0392, 1.0 - 0.0392])
    assert seen["high"] == pytest.approx([0.5 + 0.0392, 0.75 + 0.0392, 1.0 + 0.0392])
    assert math.isclose(seen["high"][0] - seen["low"][0], 2 * 1.96 * 0.02)
