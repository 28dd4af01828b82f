"""Held-out pass@k before and after training, one row per algorithm, from the shipped tiny model.

    python bench/algo_table.py                      # grpo rover pacs psr nsr w_reinforce, 1 seed, ~30 min
    python bench/algo_table.py --seeds 0,1,2 --steps 150   # 3 seeds each, the default run's budget
    python bench/algo_table.py --algos rover pacs   # a subset
    python bench/algo_table.py --lr 3e-4            # every algorithm at one learning rate
    python bench/algo_table.py --new                # the docs/math.md §7 losses (gspo ... kl_cov), ~35 min
    python bench/algo_table.py --new-2026 --seeds 0,1,2   # grpo, then the §11 losses (dppo_tv ... opsm)
    python bench/algo_table.py --algos grpo -- --top-entropy-quantile 0.2   # flags for every run

Each algorithm runs its configs/tiny_<algo>.yaml — the default run's task, batch (16 prompts × 8),
sampling and, unless --steps says otherwise, 400 steps — on 2 ranks, once per seed
(extras/seeds.py: a finished run is kept, an unfinished one continued). Only the eval differs from
that run: 16 samples per held-out problem at the first and last step, so that pass@1, pass@4 and
pass@16 are unbiased estimates (docs/math.md §6) from the same 200 problems × 16 samples. Eval never
touches the training trajectory: every step reseeds from (seed, step, rank).

Each cell is the mean over seeds ± its standard error over seeds (one seed: ± the run's eval
standard error over problems). The next column is the algorithm's pass@1 after training minus the
first algorithm's (GRPO by default), ± the standard error of that difference (docs/math.md §6.3:
the two rows' SEs over seeds, and the difference's SE over the same held-out problems, paired),
marked * where the difference exceeds 1.96 of its SE. With 3 seeds an SE over seeds is itself rough
(2 degrees of freedom): read a * as "larger than its noise by this estimate", not as a test. Each
run's logs stay in runs/algo-table/<algo>/seed-S/ (or --out DIR/...).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from extras.seeds import difference, over_seeds, problem_accuracies, read_rows, run_seeds  # noqa: E402

KS = (1, 4, 16)
NEW = ["gspo", "cispo", "sapo", "reinforce_pp", "clip_cov", "kl_cov"]  # docs/math.md §7
NEW_2026 = ["dppo_tv", "dppo_kl", "maxrl", "gmpo", "opsm"]  # docs/math.md §11


def run(algo: str, out: Path, seeds: list[int], flags: list[str]) -> tuple[dict, dict, list[float], float]:
    """(the first and the last eval over seeds, as extras.seeds.over_seeds gives them; each held-out problem's
    pass@1 at the last eval, averaged over the seeds; wall seconds) of an algorithm's runs."""
    t0 = time.perf_counter()
    folders = run_seeds(seeds, out, ["--config", f"configs/tiny_{algo}.yaml", "--eval-samples", "16",
                                     "--eval-k", ",".join(map(str, KS)), *flags], quiet=True)
    evals = [r for r in over_seeds([read_rows(f) for f in folders]) if "eval/pass@1" in r]
    return evals[0], evals[-1], problem_accuracies(folders, evals[-1]["step"]), time.perf_counter() - t0


def cell(row: dict, key: str) -> str:
    """A metric in % with its SE over seeds, or with one seed its eval SE: "83.8 ± 0.6"."""
    se = row.get(f"{key}_se", row.get(f"{key}_run_se"))
    return f"{100 * row[key]:.1f}" + (f" ± {100 * se:.1f}" if se is not None else "")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--algos", nargs="+", default=["grpo", "rover", "pacs", "psr", "nsr", "w_reinforce"])
    parser.add_argument("--new", action="store_true", help="the docs/math.md §7 losses instead: " + " ".join(NEW))
    parser.add_argument("--new-2026", action="store_true", help="grpo, then the docs/math.md §11 losses: " +
                        " ".join(NEW_2026))
    parser.add_argument("--seeds", default="0", help="comma-separated seeds, each algorithm run once per seed")
    parser.add_argument("--steps", type=int, help="training steps of every run (default: each config's)")
    parser.add_argument("--lr", help="override every config's learning rate")
    parser.add_argument("--out", default=str(ROOT / "runs" / "algo-table"),
                        help="folder of the runs (DIR/<algo>/seed-S)")
    parser.add_argument("flags", nargs="*", help="after --, more train.py flags for every run, e.g. "
                                                 "-- --top-entropy-quantile 0.2 (named in each row)")
    args = parser.parse_args()
    if args.new:
        args.algos = NEW
    if args.new_2026:  # each row's difference from GRPO, the first
        args.algos = ["grpo", *NEW_2026]
    seeds = [int(s) for s in args.seeds.split(",")]
    steps = ["--max-steps", str(args.steps), "--eval-every", str(args.steps)] if args.steps else ["--eval-every", "400"]
    flags = steps + (["--lr", args.lr] if args.lr else []) + args.flags
    header = " | ".join(f"pass@{k} before → after" for k in KS)
    lines = [f"| algo | {header} | pass@1 − {args.algos[0]} | wall |", "|---" * (len(KS) + 3) + "|"]
    first = None
    for algo in args.algos:
        before, after, problems, wall = run(algo, Path(args.out) / algo, seeds, flags)
        first = first or (after, problems)
        cells = " | ".join(f"{cell(before, f'eval/pass@{k}')} → {cell(after, f'eval/pass@{k}')}" for k in KS)
        diff, se = difference(*first, after, problems, key="eval/pass@1")
        marked = " *" if abs(diff) > 1.96 * se else ""
        against = "—" if after is first[0] else f"{100 * diff:+.1f} ± {100 * se:.1f}{marked}"
        lines.append(f"| {' '.join([algo, *args.flags])} | {cells} | {against} | {wall / 60:.1f} min |")
        print(lines[-1], flush=True)
    print(f"\nseeds {args.seeds}; mean ± standard error over seeds, in %; the difference ± its SE (seeds and "
          "problems, docs/math.md §6.3); * = it exceeds 1.96 SE")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
