"""One run over several seeds, and what the seeds say together: every metric's mean and standard error over them.

    python -m extras.seeds --seeds 0,1,2 --out runs/seeds/default          # the default run, 3 seeds
    python -m extras.seeds --seeds 0,1,2 --out runs/seeds/rover -- --config configs/tiny_rover.yaml
    python -m extras.seeds runs/a runs/b runs/c                              # summarise runs already made
    python -m extras.plot runs/seeds/default/summary --keys eval/accuracy --out seeds.svg  # mean, ±1.96 SE band

With --seeds, runs `torchrun --nproc_per_node N train.py FLAGS --seed S --out OUT/seed-S` for each
seed, one after the other. A seed whose folder holds a finished run (its metrics.jsonl reached
max_steps) is kept; an unfinished one continues from its last checkpoint (`--resume auto`), so an
interrupted sweep is started again with the same command.

Then, at each step every run logged: each metric's mean over the runs and its standard error over
them (the sample standard deviation over runs / √runs: docs/math.md §6.3), and, for an eval metric,
the runs' own standard error over problems (§6.1; `eval/accuracy_se` of each run) averaged as
`eval/accuracy_run_se`. Prints the eval table (mean ± SE over seeds [one run's eval SE]) and writes
OUT/summary/metrics.jsonl and summary.json in the keys extras/plot.py draws: `eval/accuracy` is the
mean over seeds and `eval/accuracy_se` its standard error over seeds, drawn as a band.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def finished(folder: Path, max_steps: int) -> bool:
    """Whether the run in `folder` logged its last step (a run killed earlier has not)."""
    path = folder / "metrics.jsonl"
    if not path.is_file():
        return False
    steps = []
    for line in path.read_text().splitlines():
        try:
            steps.append(json.loads(line)["step"])
        except (json.JSONDecodeError, KeyError):  # a row a killed run left half written
            continue
    return max_steps in steps


def run_seeds(seeds: list[int], out: Path, flags: list[str], nproc: int = 2, quiet: bool = False) -> list[Path]:
    """Each seed's training run, OUT/seed-S, made unless already finished; returns the folders in seed order.
    The flags are checked before any run starts, as train.py's config checks them (a mistake: ValueError)."""
    from config import parse_config, validate

    configs = [parse_config([*flags, "--seed", str(seed), "--out", str(out / f"seed-{seed}")]) for seed in seeds]
    validate(configs[0], nproc)  # the rest of train.py's checks run in each run, before it loads a model
    folders = []
    for seed, cfg in zip(seeds, configs):
        folder = out / f"seed-{seed}"
        folders.append(folder)
        if finished(folder, cfg.max_steps):
            print(f"{folder}: finished earlier, kept", file=sys.stderr, flush=True)
            continue
        folder.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "train.py", *flags,
                   "--seed", str(seed), "--out", str(folder), "--resume", "auto"]
        print(f"{folder}: {' '.join(command[2:])}", file=sys.stderr, flush=True)
        start = time.perf_counter()
        with (folder / "stdout.log").open("a") if quiet else contextlib.nullcontext() as log:
            done = subprocess.run(command, cwd=ROOT, stdout=log, stderr=log)  # None: this terminal
        if done.returncode:
            raise RuntimeError(f"{folder}: train.py exited with {done.returncode}"
                               + (f"; its output is in {folder}/stdout.log" if quiet else ""))
        print(f"{folder}: {time.perf_counter() - start:.0f} s, the whole command", file=sys.stderr, flush=True)
    return folders


def read_rows(folder: Path) -> dict[int, dict]:
    """{step: its metrics} of a run's metrics.jsonl (a half-written last line skipped)."""
    path = Path(folder) / "metrics.jsonl"
    if not path.is_file():
        raise ValueError(f"{folder}: no metrics.jsonl here; give run folders (or --seeds to make them)")
    rows = {}
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        rows.setdefault(row.pop("step"), {}).update(row)
    return rows


def mean_and_se(values: list[float]) -> tuple[float, float | None]:
    """(mean, its standard error: sample standard deviation / √len), the SE None for one value.
    [0.80, 0.78, 0.82] -> (0.80, 0.011547)."""
    from eval import standard_error  # the same formula as an eval's over problems, here over runs

    return sum(values) / len(values), standard_error(values)


def over_seeds(runs: list[dict[int, dict]]) -> list[dict]:
    """One row per step that every run logged: each metric every run logged there, as its mean over the
    runs, `<key>_se` its standard error over them, and `<key>_run_se` the mean of the runs' own `<key>_se`
    (an eval metric's SE over problems). Two runs whose step-25 eval/accuracy are 0.70 ± 0.03 and
    0.74 ± 0.03 -> {"step": 25, "eval/accuracy": 0.72, "eval/accuracy_se": 0.02, "eval/accuracy_run_se": 0.03}."""
    rows = []
    for step in sorted(set.intersection(*(set(run) for run in runs))):
        logged = [run[step] for run in runs]
        keys = [k for k in logged[0] if not k.endswith("_se") and all(k in row for row in logged)]
        row = {"step": step}
        for key in keys:
            row[key], se = mean_and_se([r[key] for r in logged])
            if se is not None:
                row[f"{key}_se"] = se
            if all(f"{key}_se" in r for r in logged):
                row[f"{key}_run_se"] = sum(r[f"{key}_se"] for r in logged) / len(logged)
        rows.append(row)
    return rows


def problem_accuracies(folders: list[Path], step: int) -> list[float]:
    """Each held-out problem's accuracy (avg@n) at `step`, averaged over the runs in `folders`, from the
    per-problem rows each run's eval kept (RUN/evals/step-N.jsonl)."""
    from eval import per_problem, read_eval

    runs = [per_problem(read_eval(str(Path(f) / "evals" / f"step-{step}.jsonl")), [1])["accuracy"] for f in folders]
    return [sum(v) / len(v) for v in zip(*runs)]


def difference(a: dict, a_problems: list[float], b: dict, b_problems: list[float],
               key: str = "eval/accuracy") -> tuple[float, float]:
    """B − A of two settings' rows of over_seeds at one step, and its standard error (docs/math.md §6.3):
    the seeds' part of each (its SE over seeds; none with one seed) and the problems' part, paired over the
    same held-out problems, each problem's accuracy averaged over a setting's seeds (problem_accuracies).
    SEs over seeds 0.007 and 0.006, paired 0.012 -> sqrt(0.007² + 0.006² + 0.012²) = 0.015."""
    from eval import paired

    seeds = a.get(f"{key}_se", 0.0) ** 2 + b.get(f"{key}_se", 0.0) ** 2
    return b[key] - a[key], math.sqrt(seeds + paired(a_problems, b_problems)["se"] ** 2)


def table(rows: list[dict], runs: int) -> str:
    """The eval metrics that carry a standard error, at every eval step, as a Markdown table in percent:
    mean ± SE over the runs [a run's own eval SE]."""
    evals = [r for r in rows if any(k.endswith("_run_se") for k in r)]
    if not evals:
        return "no step where every run logged an eval"
    keys = [k for k in evals[0] if f"{k}_run_se" in evals[0]]
    lines = [f"| step | {' | '.join(keys)} |", "|---" * (len(keys) + 1) + "|"]
    for r in evals:
        cells = [f"{100 * r[k]:.1f}" + (f" ± {100 * r[k + '_se']:.1f}" if k + "_se" in r else "")
                 + f" [{100 * r[k + '_run_se']:.1f}]" for k in keys]
        lines.append(f"| {r['step']} | {' | '.join(cells)} |")
    over = ("1 run: its value" if runs == 1 else
            f"{runs} runs: the mean over them ± its standard error over them")
    return "\n".join(lines) + (f"\n\n{over} [a run's eval standard error over problems, averaged over the runs], in %")


def summarise(folders: list[Path], out: Path | None) -> list[dict]:
    """over_seeds of the runs in `folders`, printed as a table and written to OUT/summary when out is given."""
    rows = over_seeds([read_rows(f) for f in folders])
    print(table(rows, len(folders)))
    if out is not None:
        (out / "summary").mkdir(parents=True, exist_ok=True)
        (out / "summary" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (out / "summary" / "summary.json").write_text(json.dumps({"runs": [str(f) for f in folders]}, indent=1) + "\n")
        print(f"wrote {out}/summary/metrics.jsonl: the mean over the runs, `_se` its standard error over them")
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m extras.seeds", description=__doc__.split("\n\n")[0],
                                     epilog="Without --seeds, give the run folders to summarise.")
    parser.add_argument("runs", nargs="*", metavar="RUN", help="run folders to summarise (without --seeds)")
    parser.add_argument("--seeds", help="comma-separated seeds to run, e.g. 0,1,2")
    parser.add_argument("--out", help="with --seeds: the sweep's folder (OUT/seed-S, OUT/summary)")
    parser.add_argument("--nproc", type=int, default=2, help="ranks of each run (torchrun --nproc_per_node)")
    argv = sys.argv[1:] if argv is None else list(argv)
    flags = argv[argv.index("--") + 1:] if "--" in argv else []  # train.py's, after --
    args = parser.parse_args(argv[:len(argv) - len(flags) - ("--" in argv)])
    try:
        if args.seeds:
            if args.runs or not args.out:
                raise ValueError("--seeds runs a sweep into --out DIR; give --out and no run folders "
                                 "(train.py flags go after --)")
            seeds = [int(s) for s in args.seeds.split(",")]
            if len(set(seeds)) != len(seeds):
                raise ValueError(f"--seeds {args.seeds}: a seed given twice")
            folders = run_seeds(seeds, Path(args.out), flags, args.nproc)
        elif flags or not args.runs:
            raise ValueError("give run folders to summarise, or --seeds S,S --out DIR [-- train.py flags] to run them")
        else:
            folders = [Path(f) for f in args.runs]
        summarise(folders, Path(args.out) if args.out else None)
    except (ValueError, RuntimeError) as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
