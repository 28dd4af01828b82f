"""Curves of one or several runs from their metrics.jsonl, as a PNG or SVG: matplotlib, imported only here.

    python -m extras.plot runs/grpo-20261127-120000 --out curves.png
    python -m extras.plot runs/a runs/b --keys 'reward/mean,eval/pass@*' --out compare.svg
    python -m extras.plot runs/a runs/b --keys eval/accuracy --x step,tokens/generated,time/step --out cost.png

One panel per metric, one line per run (named as given), the step on x; or, with --x, one panel per
metric and x axis: a per-step metric summed over the steps so far (tokens/generated: the tokens sampled
until then; time/step: the training's wall time, rollouts and updates, evals left out). --keys takes the names
metrics.jsonl writes and wildcards (eval/pass@* is every pass@k the runs logged); the default
draws held-out accuracy, every pass@k, the mean reward and the mean response length, and leaves out,
saying so, what no run logged (a run with --eval-every 0 has no eval/). The format follows --out's
suffix (.png, .svg, .pdf); a run still training is drawn as far as it got. Where a run logged a
metric's standard error (`eval/accuracy_se`: over problems in a run, over seeds in an extras/seeds.py
summary) its points carry a band of ±1.96 SE; wildcards leave the `_se` keys themselves out.
"""
from __future__ import annotations

import argparse
import fnmatch
import importlib.util
import json
import math
import sys
from pathlib import Path

DEFAULT_KEYS = "eval/accuracy,eval/pass@*,reward/mean,length/mean"


def read_runs(folders: list[str]) -> dict[str, list[dict]]:
    """{a run folder as given: its metrics.jsonl rows}; a line that a running or killed run left half
    written is skipped."""
    runs = {}
    for folder in map(Path, folders):
        path = folder / "metrics.jsonl"
        if not path.is_file():
            sys.exit(f"error: {folder}: no metrics.jsonl here; give run folders (runs/<algo>-<timestamp>)")
        rows = []
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        runs[str(folder)] = rows
    return runs


def chosen_keys(patterns: list[str], runs: dict[str, list[dict]]) -> list[str]:
    """The metrics the patterns name, pattern by pattern, each pattern's in the order the runs first
    logged them: ["eval/pass@*"] over rows of pass@1, pass@4 -> ["eval/pass@1", "eval/pass@4"].
    A pattern no run logged is said on stderr and left out; none logged at all is an error."""
    logged = list(dict.fromkeys(k for rows in runs.values() for row in rows for k in row if k != "step"))
    keys = []
    for pattern in patterns:
        matched = [k for k in logged if fnmatch.fnmatchcase(k, pattern)
                   and (not k.endswith("_se") or pattern.endswith("_se"))]  # an SE is its metric's band
        if not matched:
            print(f"note: no run logged {pattern}; left out", file=sys.stderr)
        keys += [k for k in matched if k not in keys]
    if not keys:
        sys.exit(f"error: the runs logged none of {', '.join(patterns)}; they logged {', '.join(logged[:12])} ...")
    return keys


def x_values(rows: list[dict], x: str) -> dict[int, float]:
    """{step: its x}: the step itself, or the per-step metric x summed over steps 1 to that step (step 0, before
    training, at 0). tokens/generated [10, 20, 30] at steps 1-3 -> {0: 0, 1: 10, 2: 30, 3: 60}."""
    if x == "step":
        return {row["step"]: row["step"] for row in rows}
    total, out = 0.0, {0: 0.0}
    for row in sorted(rows, key=lambda r: r["step"]):
        total += row.get(x, 0.0)
        out[row["step"]] = total
    return out


def trailing_mean(values: list[float], n: int) -> list[float]:
    """Each value averaged with the n − 1 before it (fewer at the start): [1, 3, 5, 7], 2 -> [1, 2, 4, 6]."""
    return [sum(values[max(0, i - n + 1):i + 1]) / (i + 1 - max(0, i - n + 1)) for i in range(len(values))]


def draw(runs: dict[str, list[dict]], keys: list[str], out: Path, smooth: int = 1, xs: tuple = ("step",)) -> None:
    """One panel per key and x axis (x_values; two columns, or one per x), one line per run; points marked where a
    run logged a key ≤ 20 times (the periodic eval), a trailing mean over `smooth` steps over each longer curve."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "rlvr"})  # SVG: text as text, the same bytes each time
    panels = [(key, x) for key in keys for x in xs]
    cols = len(xs) if len(xs) > 1 else min(2, len(keys))
    fig, axes = plt.subplots(math.ceil(len(panels) / cols), cols,
                             figsize=(4.6 * cols, 2.8 * math.ceil(len(panels) / cols)), squeeze=False)
    for ax, (key, x) in zip(axes.flat, panels):
        for name, rows in runs.items():
            at_x = x_values(rows, x)
            points = [(at_x[row["step"]], row[key]) for row in rows if key in row]
            if not points:  # this run did not log it
                continue
            steps, values = zip(*points)
            if len(steps) <= 20:  # the periodic eval: each point marked, none smoothed
                line, = ax.plot(steps, values, label=name, lw=1.2, marker="o", ms=3)
                band = [(at_x[row["step"]], row[key], row[f"{key}_se"]) for row in rows if f"{key}_se" in row]
                if band:  # the 95% interval of each point: ±1.96 standard errors (docs/math.md §6.1)
                    at, mid, se = zip(*band)
                    ax.fill_between(at, [m - 1.96 * e for m, e in zip(mid, se)], [m + 1.96 * e for m, e in zip(mid, se)],
                                    color=line.get_color(), alpha=0.2, lw=0)
            elif smooth > 1:  # the raw curve faint, its trailing mean over `smooth` steps on top
                line, = ax.plot(steps, values, lw=0.8, alpha=0.3)
                ax.plot(steps, trailing_mean(values, smooth), color=line.get_color(), label=name, lw=1.4)
            else:
                ax.plot(steps, values, label=name, lw=1.2)
        ax.set_title(key, fontsize=10)
        ax.set_xlabel(x if x == "step" else f"{x}, summed over the steps", fontsize=9)
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=min(len(labels), 4), frameon=False, fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / fig.get_figheight()))  # room for the legend above the panels
    fig.savefig(out, dpi=100, metadata={"Date": None} if out.suffix == ".svg" else None)
    plt.close(fig)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m extras.plot", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", metavar="RUN", help="run folders, each with its metrics.jsonl")
    parser.add_argument("--keys", default=DEFAULT_KEYS,
                        help=f"metrics to draw, comma-separated; wildcards allowed (default {DEFAULT_KEYS})")
    parser.add_argument("--smooth", type=int, default=1,
                        help="each per-step curve faint under its trailing mean over this many steps (default 1: off)")
    parser.add_argument("--x", default="step",
                        help="x axes, comma-separated: step, or a per-step metric summed over the steps so far "
                             "(tokens/generated, time/step); a panel for each metric and x (default step)")
    parser.add_argument("--out", default="curves.png", help="the picture: .png, .svg or .pdf (default curves.png)")
    args = parser.parse_args(argv)
    if importlib.util.find_spec("matplotlib") is None:  # said before anything is read
        sys.exit("error: extras/plot.py draws with matplotlib, which is not installed here: pip install matplotlib")
    runs = read_runs(args.runs)
    keys = chosen_keys([k.strip() for k in args.keys.split(",")], runs)
    xs = tuple(x.strip() for x in args.x.split(","))
    draw(runs, keys, Path(args.out), args.smooth, xs)
    print(f"{args.out}: {', '.join(keys)}{'' if xs == ('step',) else ' against ' + ', '.join(xs)} of {', '.join(runs)}")


if __name__ == "__main__":
    main()
