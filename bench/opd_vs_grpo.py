"""RL or distillation: GRPO and on-policy distillation (--algo opd) from the same student, seeds and budget.

    torchrun --nproc_per_node 2 train.py --algo grpo --out runs/teacher       # the teacher: the default run, ~3 min
    python bench/opd_vs_grpo.py --teacher runs/teacher/checkpoints/step-150   # 3 seeds of each, ~20 min on 2 cores
    python bench/opd_vs_grpo.py --teacher T --grpo runs/seeds/default         # GRPO's seeds made already (extras.seeds)
    python bench/opd_vs_grpo.py --teacher T --grpo G --opd O                  # both made: the tables alone
    python bench/opd_vs_grpo.py --teacher T --cost                            # the teacher's forward, timed alone

Both arms are the default run (the shipped model, 16 prompts × 8, 150 steps, eval every 25) on 2 ranks, once per
seed (extras/seeds.py: a finished run is kept, an unfinished one continued); OPD adds `--algo opd --teacher T`
(α = 0: the teacher's per-token reverse KL alone, docs/math.md §10). Prints, per arm and eval step, held-out accuracy
(mean ± SE over seeds), the tokens sampled and the training's wall time until then (time/step summed: rollouts and
updates, evals left out; mean over seeds); when each seed first reached --target; what a step costs (time/rollout,
time/update: OPD's update also runs the teacher's forward); and OPD − GRPO at each eval with its standard error
(docs/math.md §6.3). Wall times follow the machine's load when each run ran: a GRPO sweep made on another day
compares its steps and tokens, not its seconds. --cost times, in one process on one thread (a rank's), what one
rank's update adds for the teacher against what it pays anyway, on the same batch, alternately, medians.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from extras.seeds import difference, mean_and_se, over_seeds, problem_accuracies, read_rows, run_seeds  # noqa: E402


def so_far(rows: dict[int, dict], key: str) -> dict[int, float]:
    """{step: key summed over steps 1..step}: tokens/generated or time/step until each step."""
    total, out = 0.0, {}
    for step in sorted(rows):
        total += rows[step].get(key, 0.0)
        out[step] = total
    return out


def reached(rows: dict[int, dict], target: float) -> int | None:
    """The first eval step whose held-out accuracy is at least target (None: never)."""
    return next((s for s in sorted(rows) if rows[s].get("eval/accuracy", -1.0) >= target), None)


def report(name: str, folders: list[Path], target: float) -> list[dict]:
    """Print one arm's table and cost; return its over_seeds rows."""
    runs = [read_rows(f) for f in folders]
    summary = over_seeds(runs)
    tokens, wall = [so_far(r, "tokens/generated") for r in runs], [so_far(r, "time/step") for r in runs]
    print(f"\n{name} ({len(runs)} seeds: {', '.join(map(str, folders))})")
    print("| step | eval/accuracy, % | tokens sampled | training wall, s |\n|---|---|---|---|")
    for row in (r for r in summary if "eval/accuracy" in r):
        s = row["step"]
        print(f"| {s} | {100 * row['eval/accuracy']:.1f} ± {100 * row.get('eval/accuracy_se', 0):.1f} | "
              f"{mean_and_se([t[s] for t in tokens])[0]:,.0f} | {mean_and_se([w[s] for w in wall])[0]:.0f} |")
    firsts = [reached(r, target) for r in runs]
    print(f"first eval at ≥ {100 * target:g}%, per seed: step {firsts}; tokens "
          f"{[None if s is None else int(t[s]) for s, t in zip(firsts, tokens)]}; wall s "
          f"{[None if s is None else round(w[s]) for s, w in zip(firsts, wall)]}")
    for key in ("time/rollout", "time/update", "time/step"):
        per_run = [mean_and_se([r[s][key] for s in r if key in r[s]])[0] for r in runs]
        print(f"{key}: {mean_and_se(per_run)[0]:.3f} s a step (per seed {', '.join(f'{v:.3f}' for v in per_run)})")
    return summary


def forward_cost(teacher: str, rows: int = 64, response: int = 52, repeats: int = 10) -> None:
    """Median seconds of the teacher's no-grad log-prob forward and of the student's forward + backward (the
    update's own work at K = 1) on one rank's micro-batch of the default run: 64 rows, its prompts, responses
    of about its mean length (52 tokens; the cost depends on the shapes alone, so the tokens are drawn)."""
    import statistics
    import time

    import torch

    import data
    from config import Config
    from model import ResponseLogProbs, load_model, load_tokenizer
    from rollout import Chunk, collate, encode_prompts

    torch.set_num_threads(1)
    cfg = Config()
    tokenizer = load_tokenizer(cfg.model)
    _, problems, _ = data.load(cfg)
    draw = torch.Generator().manual_seed(0)
    chunks = [Chunk(p, torch.randint(3, len(tokenizer), (response + i % 9 - 4,), generator=draw).tolist())
              for i, p in enumerate(encode_prompts(tokenizer, problems[:rows], cfg.chat_template))]
    batch = collate(chunks, tokenizer.pad_token_id, torch.device("cpu"))
    args = (batch.input_ids, batch.attention_mask, batch.position_ids, batch.response_mask, 1.0)
    student = ResponseLogProbs(load_model(cfg.model))
    scorer = ResponseLogProbs(load_model(teacher, trainable=False))
    times = {"teacher forward, no grad": [], "student forward + backward": []}
    for _ in range(repeats):
        start = time.perf_counter()
        with torch.no_grad():
            scorer(*args)
        middle = time.perf_counter()
        student(*args)["logp"].sum().backward()
        times["teacher forward, no grad"].append(middle - start)
        times["student forward + backward"].append(time.perf_counter() - middle)
    print(f"one rank's micro-batch: {rows} rows × {batch.input_ids.shape[1]} tokens (responses "
          f"{sum(len(c.response_ids) for c in chunks) / rows:.1f} on average), {repeats} times, one thread:")
    for name, values in times.items():
        print(f"  {name}: median {statistics.median(values):.3f} s (min {min(values):.3f}, max {max(values):.3f})")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--teacher", required=True, help="the teacher's model folder (a default run's checkpoint)")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--out", default="runs/opd-vs-grpo", help="the arms' runs: OUT/grpo/seed-S, OUT/opd/seed-S")
    parser.add_argument("--grpo", default="", help="a GRPO sweep made already (its seed-S folders) instead of OUT/grpo")
    parser.add_argument("--opd", default="", help="an OPD sweep made already, the same way")
    parser.add_argument("--target", type=float, default=0.75, help="the held-out accuracy to reach (default 0.75)")
    parser.add_argument("--cost", action="store_true", help="time the teacher's forward alone (forward_cost)")
    args = parser.parse_args(argv)
    if args.cost:
        return forward_cost(args.teacher)
    seeds, out = [int(s) for s in args.seeds.split(",")], Path(args.out)
    arms = ((args.grpo, "grpo", ["--algo", "grpo"]), (args.opd, "opd", ["--algo", "opd", "--teacher", args.teacher]))
    grpo, opd = ([Path(made) / f"seed-{s}" for s in seeds] if made else run_seeds(seeds, out / name, flags, quiet=True)
                 for made, name, flags in arms)
    a, b = report("grpo", grpo, args.target), report("opd", opd, args.target)
    print("\nopd − grpo, held-out accuracy in points ± its SE (seeds and problems, paired; * beyond 1.96 SE):")
    for row_a, row_b in zip(*([r for r in arm if "eval/accuracy" in r and r["step"] > 0] for arm in (a, b))):
        step = row_a["step"]
        diff, se = difference(row_a, problem_accuracies(grpo, step), row_b, problem_accuracies(opd, step))
        print(f"  step {step}: {100 * diff:+.1f} ± {100 * se:.1f}{' *' if abs(diff) > 1.96 * se else ''}")


if __name__ == "__main__":
    main()
