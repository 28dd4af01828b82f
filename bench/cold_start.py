"""A cold start: a student the reward cannot teach, and four ways to warm it — GRPO, SFT on teacher traces,
SFT then GRPO, on-policy distillation — over seeds, each with its tokens and wall time.

    python bench/cold_start.py                      # the whole study: ~1 h on 2 cores shared with ~20 other jobs
    python bench/cold_start.py --arms grpo --seeds 1 &     # an arm's seed in a process of its own; then the
    python bench/cold_start.py                             # whole command again prints the tables

1. The cold student: the shipped model (assets/tiny-running-sum) after `--algo sft` on 512 running sums solved
   without the answer tag ("12+7=19 19+35=54"), --sft-steps-cold steps at a constant lr 3e-3, seed 0: it writes
   the partial sums and no <answer>, so every reward is 0 and a group has nothing to compare.
2. The teacher's traces: `python -m extras.traces assets/tiny-running-sum ... --correct` on the first --traces
   training problems (another slice of the split than the cold data's): its correct responses, N of them.
3. The arms, from the cold student, 1 rank, eval of --eval-problems held-out problems × 2 samples every
   --eval-every steps: grpo (--steps optimizer steps of --prompts 8 prompts × --group 4 samples, lr 3e-4, the
   default's); opd (the same, --teacher the shipped model); sft (8 traces a step, lr 3e-4); sft_lr3e-3 (the same at
   lr 3e-3, the lr that made the cold student); sft_grpo (--sft-grpo-steps 6 in all: --sft-steps 3 of SFT at
   --sft-lr 3e-3, then GRPO from that checkpoint, its steps counted on). Each seed's run is
   extras.seeds.run_seeds' (a finished one is kept), so arms and seeds can run in processes of their own.
Prints, per arm and eval step, held-out accuracy (mean ± SE over seeds), the tokens trained on (tokens/forward:
prompt and response tokens through the update's forwards), tokens sampled and the training's wall time (time/step
summed, evals left out) until then, means over seeds.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from extras.seeds import mean_and_se, over_seeds, read_rows, run_seeds  # noqa: E402
from opd_vs_grpo import so_far  # noqa: E402  (bench/, this script's folder, is on the path)

TEACHER = str(ROOT / "assets" / "tiny-running-sum")


def untagged(path: Path, count: int = 512) -> None:
    """The cold data: the last `count` running-sum training problems, each solved as the shipped model was taught
    (tasks.RunningSumTask.solution) but without its <answer> tag."""
    import data
    from config import Config
    from tasks import RunningSumTask

    _, problems, _ = data.load(Config())
    rows = []
    for p in problems[-count:]:
        terms = [int(t) for t in p.prompt.removeprefix("Add ").split("+")]
        rows.append({"prompt": p.prompt, "response": re.sub(r" <answer>.*</answer>", "",
                                                             RunningSumTask.solution(terms))})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def staged(first: Path, second: Path, out: Path, offset: int) -> Path:
    """One run's folder of two stages: the first's steps 1..offset and its evals before offset, then the
    second's steps and evals counted on from offset (its step-0 eval is the first stage's end)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "evals").mkdir(exist_ok=True)
    a, b = read_rows(first), read_rows(second)
    rows = {s: r for s, r in a.items() if s < offset or (s == offset and "eval/accuracy" not in b.get(0, {}))}
    for s, r in b.items():
        rows.setdefault(s + offset, {}).update(r)
    (out / "metrics.jsonl").write_text("".join(json.dumps({"step": s, **rows[s]}) + "\n" for s in sorted(rows)))
    for folder, shift in ((first, 0), (second, offset)):
        for f in (folder / "evals").glob("step-*.jsonl"):
            step = int(f.stem[5:]) + shift
            if folder == second or step < offset:
                (out / "evals" / f"step-{step}.jsonl").write_text(f.read_text())
    return out


def report(name: str, folders: list[Path]) -> None:
    runs = [read_rows(f) for f in folders]
    costs = {key: [so_far(r, key) for r in runs] for key in ("tokens/forward", "tokens/generated", "time/step")}
    print(f"\n{name} ({len(runs)} seeds)\n| step | eval/accuracy, % | reward/mean | tokens trained | tokens sampled "
          f"| training wall, s |\n|---|---|---|---|---|---|")
    for row in (r for r in over_seeds(runs) if "eval/accuracy" in r):
        s = row["step"]
        reward = f"{row['reward/mean']:.3f}" if "reward/mean" in row else "—"
        cells = [f"{mean_and_se([c[s] for c in costs[k]])[0]:,.0f}" for k in ("tokens/forward", "tokens/generated")]
        print(f"| {s} | {100 * row['eval/accuracy']:.1f} ± {100 * row.get('eval/accuracy_se', 0):.1f} | {reward} | "
              f"{' | '.join(cells)} | {mean_and_se([w[s] for w in costs['time/step']])[0]:.0f} |")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/cold-start")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=12, help="optimizer steps of every arm")
    parser.add_argument("--arms", default="grpo,sft,sft_lr3e-3,opd,sft_grpo", help="the arms to run (finished: kept)")
    parser.add_argument("--sft-grpo-steps", type=int, default=6, help="sft_grpo's optimizer steps in all")
    parser.add_argument("--sft-steps", type=int, default=3, help="of those, its SFT steps (then GRPO's)")
    parser.add_argument("--sft-lr", type=float, default=3e-3, help="the learning rate of sft_grpo's SFT steps")
    parser.add_argument("--sft-steps-cold", type=int, default=100, help="SFT steps that make the cold student")
    parser.add_argument("--traces", type=int, default=256, help="training problems the teacher answers")
    parser.add_argument("--eval-every", type=int, default=6)
    parser.add_argument("--prompts", type=int, default=8, help="prompts (SFT: traces) a step")
    parser.add_argument("--group", type=int, default=4, help="grpo and opd: samples per prompt")
    parser.add_argument("--eval-problems", type=int, default=50)
    args = parser.parse_args(argv)
    out, seeds = Path(args.out), [int(s) for s in args.seeds.split(",")]
    out.mkdir(parents=True, exist_ok=True)
    if not (out / "untagged.jsonl").is_file():
        untagged(out / "untagged.jsonl")
    cold_flags = ["--algo", "sft", "--model", TEACHER, "--sft-data", str(out / "untagged.jsonl"), "--lr", "3e-3",
                  "--lr-schedule", "constant", "--max-steps", str(args.sft_steps_cold), "--eval-every", "0",
                  "--report-to", "none"]
    [cold_run] = run_seeds([0], out / "cold", cold_flags, nproc=1, quiet=True)
    cold = str(cold_run / "checkpoints" / f"step-{args.sft_steps_cold}")
    traces = out / "teacher.jsonl"
    if not traces.is_file():
        subprocess.run([sys.executable, "-m", "extras.traces", TEACHER, str(traces), "--correct", "--problems",
                        str(args.traces)], cwd=ROOT, check=True)
    common = ["--model", cold, "--eval-every", str(args.eval_every), "--eval-problems", str(args.eval_problems),
              "--eval-samples", "2", "--eval-k", "1,2", "--report-to", "none", "--prompts-per-step", str(args.prompts)]
    rl = ["--group-size", str(args.group)]
    sft = ["--algo", "sft", "--sft-data", str(traces)]
    arms = {"grpo": ["--algo", "grpo", *rl], "sft": sft, "sft_lr3e-3": [*sft, "--lr", "3e-3"],
            "opd": ["--algo", "opd", "--teacher", TEACHER, *rl]}
    chosen = args.arms.split(",")
    folders = {name: run_seeds(seeds, out / name, [*flags, *common, "--max-steps", str(args.steps)], nproc=1,
                               quiet=True) for name, flags in arms.items() if name in chosen}
    if "sft_grpo" not in chosen:
        return
    first = run_seeds(seeds, out / "sft_first", [*sft, *common, "--max-steps", str(args.sft_steps), "--lr",
                                                 str(args.sft_lr), "--eval-every", "0"], nproc=1, quiet=True)
    rest = str(args.sft_grpo_steps - args.sft_steps)
    then = [run_seeds([s], out / "grpo_after", ["--algo", "grpo", *rl, *common, "--max-steps", rest, "--eval-every",
                                                rest, "--model", str(f / "checkpoints" / f"step-{args.sft_steps}")],
                      nproc=1, quiet=True)[0] for s, f in zip(seeds, first)]
    folders["sft_grpo"] = [staged(a, b, out / "sft_grpo" / a.name, args.sft_steps) for a, b in zip(first, then)]
    print(f"the teacher's traces: {sum(1 for _ in traces.open())} correct responses of {args.traces} ({traces})")
    for name in ("grpo", "sft", "sft_lr3e-3", "sft_grpo", "opd"):
        report(name, folders.get(name) or [out / name / f"seed-{s}" for s in seeds])


if __name__ == "__main__":
    main()
