"""What a pass-rate filter buys: training on a data file of mixed difficulty as it is, and filtered to the
rows the shipped model solves sometimes (extras/pass_filter.py), from the same model, seeds and budget.

    python bench/filter_demo.py                          # seeds 0,1,2, 100 steps each run
    python bench/filter_demo.py --seeds 0 --steps 30     # a quick look

1. Writes runs/filter-demo/train.jsonl and heldout.jsonl: running sums of 2 to 7 terms of 2 digits
   (the shipped model learned 3 to 5 terms of 2 digits), each row with an id, held-out prompts kept out of train.
2. eval.py on train.jsonl: each row's pass rate from 8 samples (runs/filter-demo/rates/problems.jsonl).
3. extras/pass_filter.py keeps the rows with a pass rate in [0.1, 0.9] (kept.jsonl).
4. extras/seeds.py trains on train.jsonl and on kept.jsonl (2 ranks each, 16 prompts × 8), evaluating on
   heldout.jsonl (200 rows × 4 samples) every --eval-every steps.
Prints the filter's counts and a Markdown table: held-out accuracy at each eval (mean ± SE over seeds),
the mean share of groups with no reward spread (reward/zero_std_groups), and wall time.
"""
from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from extras.seeds import difference, mean_and_se, over_seeds, problem_accuracies, read_rows, run_seeds  # noqa: E402
from tasks import RunningSumTask  # noqa: E402

MIX = [(terms, 2) for terms in range(2, 8)]  # 2-digit terms: other widths the shipped model never saw


def write_data(out: Path, train_rows: int, heldout_rows: int) -> None:
    """train.jsonl and heldout.jsonl of running sums, each (terms, digits) of MIX equally likely; no held-out
    prompt in train."""
    rng = random.Random("filter-demo")
    seen, rows = set(), []
    while len(rows) < train_rows + heldout_rows:
        terms, digits = rng.choice(MIX)
        problem = RunningSumTask(terms, terms, digits).sample(rng)[0]
        if problem.prompt not in seen:
            seen.add(problem.prompt)
            rows.append({"prompt": problem.prompt, "answer": problem.answer, "terms": terms, "digits": digits})
    for name, part in (("train", rows[:train_rows]), ("heldout", rows[train_rows:])):
        (out / f"{name}.jsonl").write_text("".join(json.dumps({"id": f"{name}-{i}", **r}) + "\n"
                                                   for i, r in enumerate(part)))


def command(*args: str, log: Path) -> None:
    with log.open("w") as f:
        subprocess.run([sys.executable, *args], cwd=ROOT, check=True, stdout=f, stderr=subprocess.STDOUT)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--rows", type=int, default=400, help="training rows before the filter")
    parser.add_argument("--out", default=str(ROOT / "runs" / "filter-demo"))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_data(out, args.rows, 200)
    t0 = time.perf_counter()
    if not (out / "rates" / "problems.jsonl").is_file():
        command("-m", "torch.distributed.run", "--nproc_per_node", "2", "eval.py", "--data", str(out / "train.jsonl"),
                "-n", "8", "--k", "1,8", "--no-greedy", "--out", str(out / "rates"), log=out / "rates.log")
    rates_wall = time.perf_counter() - t0
    command("-m", "extras.pass_filter", str(out / "train.jsonl"), str(out / "rates"), "--keep", "0.1,0.9",
            "--out", str(out / "kept.jsonl"), log=out / "filter.log")
    print((out / "filter.log").read_text().strip(), f"(pass rates: {rates_wall / 60:.1f} min)\n")
    seeds = [int(s) for s in args.seeds.split(",")]
    flags = ["--eval-data", str(out / "heldout.jsonl"), "--max-steps", str(args.steps),
             "--eval-every", str(args.eval_every), "--eval-problems", "0"]
    table = {}
    for name in ("train", "kept"):
        t0 = time.perf_counter()
        folders = run_seeds(seeds, out / name, ["--data", str(out / f"{name}.jsonl"), *flags], quiet=True)
        runs = [read_rows(f) for f in folders]
        zero = mean_and_se([sum(r["reward/zero_std_groups"] for r in run.values() if "reward/zero_std_groups" in r)
                            / args.steps for run in runs])
        evals = [r for r in over_seeds(runs) if "eval/accuracy" in r]
        table[name] = (evals, [problem_accuracies(folders, r["step"]) for r in evals], zero, time.perf_counter() - t0)
    steps = [r["step"] for r in table["train"][0]]
    print(f"| data | {' | '.join(f'step {s}' for s in steps)} | zero_std_groups | wall |")
    print("|---" * (len(steps) + 3) + "|")
    for name, (evals, _, zero, wall) in table.items():
        cells = " | ".join(f"{100 * r['eval/accuracy']:.1f}" + (f" ± {100 * r['eval/accuracy_se']:.1f}"
                                                               if "eval/accuracy_se" in r else "") for r in evals)
        spread = f" ± {100 * zero[1]:.1f}" if zero[1] is not None else ""
        print(f"| {name}.jsonl | {cells} | {100 * zero[0]:.1f}%{spread} | {wall / 60:.1f} min |")
    cells = []
    for a, a_problems, b, b_problems in zip(table["train"][0], table["train"][1], table["kept"][0], table["kept"][1]):
        diff, se = difference(a, a_problems, b, b_problems)
        cells.append(f"{100 * diff:+.1f} ± {100 * se:.1f}" + (" *" if abs(diff) > 1.96 * se else ""))
    print(f"| kept − train | {' | '.join(cells)} | | |")
    print(f"\nheld-out accuracy (%, heldout.jsonl: 200 rows × 4 samples), mean ± SE over seeds {args.seeds}; kept − "
          "train ± its SE (seeds and problems, paired: docs/math.md §6.3), * beyond 1.96 SE; zero_std_groups: the "
          "mean over steps of the share of groups whose 8 rewards are all equal")


if __name__ == "__main__":
    main()
