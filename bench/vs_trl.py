"""Step time of this project against TRL's GRPOTrainer: same model, task, prompts and settings.

    pip install trl              # for this benchmark only; never a requirement of the project
    python bench/vs_trl.py       # ~4-5 minutes on 2 CPU cores: 3 repeats × 2 settings × 3 trainers
    python bench/vs_trl.py --worlds 1 --trainers "ours hf" "ours hf --pack true" TRL   # with and without --pack

The shipped tiny model (assets/tiny-running-sum), the built-in running-sum task, 16 prompts ×
8 samples per step, ≤ 80 new tokens, temperature 1 (no top-k, no top-p), β = 0 (no reference
model), one optimizer step per rollout batch (K = μ = 1), AdamW at lr 3e-4 after 5 warm-up steps,
grad-norm clip 1, fp32 on CPU, no gradient checkpointing, no vLLM; on 1 process and on 2 ranks
(torchrun --nproc_per_node 2, gloo, one thread per rank). Three trainers:

- ours, hf:   python train.py --max-steps 10 --eval-every 0 --out DIR   (torchrun ... for 2 ranks)
- ours, fast: the same with --engine fast (engine.py)
- TRL:        GRPOTrainer in a subprocess running this file with --trl-child (under torchrun for
              2 ranks): num_generations 8, 64 completions per forward (2 accumulation steps on
              1 process, 64 per rank on 2 ranks: 128 per optimizer step, as our micro-batch of 64),
              max_completion_length 80, loss_type "grpo" (per-sequence token mean, then the mean
              over sequences = our default seq-mean-token-mean), scale_rewards "group" (our
              group-normalised advantages), epsilon 0.2, the same model object (model.load_model),
              tokenizer, chat template, prompts in the same order (tasks.PromptStream of the
              built-in training split, seed 0) and reward (RunningSumTask().grade(problem, text));
              DDP without find_unused_parameters, as ours.

Ours reads time/step, time/rollout and time/update from DIR/metrics.jsonl (rank 0; they exclude
logging, eval and checkpoints). TRL's step is timed by a TrainerCallback from on_step_begin to
on_step_end (generation, reward, forward/backward, clip, optimizer step; not logging), and its
rollout by timing GRPOTrainer._generate_and_score_completions (generate, decode, reward,
advantages); its update is step − rollout. The trainers run interleaved (each repeat runs every
trainer once in each setting), so all see the same machine load; the table gives medians over
steps 3..--steps of all repeats (steps 1-2 warm up), and the ratio ours / TRL of the step medians.
Mean completion lengths are printed too: a step's cost follows them, and the sampling differs.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PER_FORWARD = 64  # completions per forward/backward on one rank: our micro_batch_size default
FIRST_TIMED = 3  # steps before this one warm up


# ============================================================================ TRL, in a subprocess

def trl_child(out: Path, steps: int) -> None:
    """One TRL GRPOTrainer run of `steps` optimizer steps; rank 0 writes per-step times to `out`."""
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from config import DEFAULT_MODEL, Config
    from model import load_model, load_tokenizer
    from rewards import Problem
    from tasks import RunningSumTask, builtin_splits
    from tasks import PromptStream

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:  # what parallel.setup_distributed gives each CPU rank (torchrun's default, too)
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["LOCAL_WORLD_SIZE"])))
    cfg = Config()  # our defaults: the settings of both sides come from here
    task = RunningSumTask(cfg.sum_min_terms, cfg.sum_max_terms, cfg.sum_digits)
    # the prompts our run sees, in its order (TRL's sampler then gives rank r the r-th 8 of 16)
    problems = PromptStream(builtin_splits(task, cfg.seed)[0], cfg.seed).get(0, cfg.prompts_per_step * steps)
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": p.prompt}], "question": p.prompt,
                                  "answer": p.answer} for p in problems])

    def reward(completions, question, answer, **_):
        return [task.grade(Problem(q, a), c[0]["content"]).reward for c, q, a in zip(completions, question, answer)]

    times, rollouts = [], []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            times.append(time.perf_counter() - self.start)

    class TimedGRPOTrainer(GRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            start = time.perf_counter()
            result = super()._generate_and_score_completions(inputs)
            rollouts.append(time.perf_counter() - start)
            return result

    batch = cfg.prompts_per_step * cfg.group_size  # completions per optimizer step, all ranks
    args = GRPOConfig(
        output_dir=str(out.parent / "trl-out"), max_steps=steps, seed=cfg.seed,
        per_device_train_batch_size=PER_FORWARD, gradient_accumulation_steps=batch // (PER_FORWARD * world),
        num_generations=cfg.group_size, max_completion_length=cfg.max_new_tokens,
        temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
        beta=cfg.beta, num_iterations=cfg.epochs, epsilon=cfg.clip_low, epsilon_high=cfg.clip_high,
        loss_type="grpo", scale_rewards="group", mask_truncated_completions=False,
        learning_rate=cfg.lr, lr_scheduler_type="constant_with_warmup", warmup_steps=cfg.warmup_steps,
        weight_decay=cfg.weight_decay, max_grad_norm=cfg.grad_clip, optim="adamw_torch",
        bf16=False, fp16=False, use_cpu=True, gradient_checkpointing=False, use_vllm=False,
        shuffle_dataset=False, ddp_backend="gloo" if world > 1 else None, ddp_find_unused_parameters=False,
        dataloader_num_workers=0,
        logging_steps=1, report_to="none", save_strategy="no", disable_tqdm=True)
    trainer = TimedGRPOTrainer(model=load_model(DEFAULT_MODEL), reward_funcs=reward, args=args,
                               train_dataset=dataset, processing_class=load_tokenizer(DEFAULT_MODEL),
                               callbacks=[Timer()])
    trainer.train()
    if int(os.environ.get("RANK", "0")) == 0:
        lengths = [row["completions/mean_length"] for row in trainer.state.log_history
                   if "completions/mean_length" in row]
        rows = [{"step": i + 1, "time/step": t, "time/rollout": r, "time/update": t - r, "length/mean": n}
                for i, (t, r, n) in enumerate(zip(times, rollouts, lengths))]
        out.write_text(json.dumps({"rows": rows}))


# ============================================================================ the comparison

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launcher(world: int) -> list[str]:
    if world == 1:
        return [sys.executable]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(world),
            "--master_port", str(free_port())]


def run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{(proc.stdout + proc.stderr)[-4000:]}")


def ours(trainer: str, world: int, folder: Path, steps: int) -> list[dict]:
    """A run of "ours ENGINE [FLAGS]": `--engine ENGINE`, FLAGS added (e.g. "ours hf --pack true")."""
    out = folder / "run"
    engine, *flags = trainer.split()[1:]
    run(launcher(world) + ["train.py", "--max-steps", str(steps), "--eval-every", "0", "--out", str(out),
                           "--engine", engine, *flags])
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def theirs(world: int, folder: Path, steps: int) -> list[dict]:
    out = folder / "trl.json"
    run(launcher(world) + [str(Path(__file__).resolve()), "--trl-child", str(out), "--steps", str(steps)])
    return json.loads(out.read_text())["rows"]


def median(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def cell(rows: list[dict]) -> str:
    """s/step (rollout + update, the update's share of the step)."""
    return (f"{median(rows, 'time/step'):.3f} ({median(rows, 'time/rollout'):.3f} + "
            f"{median(rows, 'time/update'):.3f}, {median(rows, 'time/update') / median(rows, 'time/step'):.0%})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats of every run")
    parser.add_argument("--steps", type=int, default=10, help="optimizer steps per run; steps 3.. are timed")
    parser.add_argument("--worlds", type=int, nargs="+", default=[1, 2], help="process counts to compare")
    parser.add_argument("--trainers", nargs="+", default=["ours hf", "ours fast", "TRL"],
                        help='what runs: TRL and "ours ENGINE [FLAGS]", e.g. "ours hf --pack true"')
    parser.add_argument("--trl-child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trl_child:
        return trl_child(args.trl_child, args.steps)
    try:
        import trl
    except ImportError as e:
        sys.exit(f"bench/vs_trl.py compares against TRL, which does not import ({e}): `pip install trl` "
                 f"(for this benchmark only; the project never needs it)")
    if args.steps < FIRST_TIMED:
        sys.exit(f"--steps must be at least {FIRST_TIMED}")
    trainers, ourselves = args.trainers, [t for t in args.trainers if t != "TRL"]
    rows = {(w, t): [] for w in args.worlds for t in trainers}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for w in args.worlds:
                for t in trainers:
                    folder = Path(tmp) / f"{r}-{w}-{t.replace(' ', '-')}"
                    folder.mkdir()
                    got = theirs(w, folder, args.steps) if t == "TRL" else ours(t, w, folder, args.steps)
                    rows[w, t] += [x for x in got if x["step"] >= FIRST_TIMED]
                    print(f"repeat {r + 1}/{args.repeats}, {w} process(es), {t}: "
                          f"{median(got[FIRST_TIMED - 1:], 'time/step'):.3f} s/step", file=sys.stderr, flush=True)
    setting = {1: "1 process"}
    print(f"\nTRL {trl.__version__}; s/step (rollout + update, the update's share), medians of steps "
          f"{FIRST_TIMED}-{args.steps} of {args.repeats} interleaved repeats; "
          f"{time.perf_counter() - start:.0f} s in all\n")
    names = [t.replace("TRL", "TRL GRPOTrainer") for t in trainers]
    print("| setting | " + " | ".join(names + [f"{t} / TRL" for t in ourselves]) + " |")
    print("|---" * (1 + len(trainers) + len(ourselves)) + "|")
    for w in args.worlds:
        trl_step = median(rows[w, "TRL"], "time/step")
        print(f"| {setting.get(w, f'{w} ranks')} | " + " | ".join(
            [cell(rows[w, t]) for t in trainers] + [f"{median(rows[w, t], 'time/step') / trl_step:.2f}"
                                                     for t in ourselves]) + " |")
    print("\nmean completion length, tokens (mean over the timed steps): " + "; ".join(
        f"{setting.get(w, f'{w} ranks')}: " + ", ".join(
            f"{t} {statistics.mean(x['length/mean'] for x in rows[w, t]):.1f}" for t in trainers)
        for w in args.worlds))


if __name__ == "__main__":
    main()
