"""A real model's shape on a GPU: bf16 training steps with long responses; peak memory and
tokens/s per phase, next to the memory plan.

    python bench/gpu_run.py --shape Qwen2.5-1.5B-Instruct                 # 3 steps, 1024-token responses
    python bench/gpu_run.py --shape Qwen2.5-3B -- --rollout-batch-size 64  # after --: train.py flags
    python bench/gpu_run.py --out runs/gpu-fast -- --engine fast            # the engine (compare with hf)

The model is random-initialised from assets/shapes/<shape>/config.json (the real architecture
and vocabulary; no download), with the character tokenizer padded to the real vocabulary. A random
model almost never writes EOS, so every response runs the whole budget and every step does the
same work: what a step of a recipe costs at that length. Nothing is answered right, so rewards
and the loss are 0, but generation, forward and backward run in full. Runs `train.py` (FSDP,
world size 1 unless launched otherwise) and prints, per step: seconds and tokens/s of the rollout
and the update, and each phase's peak GPU memory; then `train.py --plan` for the same flags.
"""
from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "assets")]
from build_tiny_model import build_tokenizer  # noqa: E402
from config import parse_config  # noqa: E402
from extras.plan import GiB, estimate, find_shape  # noqa: E402


def build(shape: str, out: Path, layers: int = 0, **overrides) -> None:
    """A random-initialised bf16 model of the shape, cut to `layers` decoder layers (0: all), with HF
    config `overrides` (bench/gpu_check.py's CPU smoke run narrows it), and a tokenizer of its
    vocabulary, in `out`."""
    config = AutoConfig.from_pretrained(ROOT / "assets" / "shapes" / shape, **overrides)
    if layers:
        config.num_hidden_layers = layers
        config.layer_types = config.layer_types[:layers] if getattr(config, "layer_types", None) else None
    tok = build_tokenizer(config.vocab_size)
    config.eos_token_id, config.pad_token_id, config.bos_token_id = tok.eos_token_id, tok.pad_token_id, None
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(out)
    tok.save_pretrained(out)


def recipe_flags(model_dir: Path, steps: int, max_new_tokens: int, prompts: int) -> list[str]:
    """train.py's flags for `steps` steps of `prompts` prompts × 8 on the model in model_dir."""
    return ["--model", str(model_dir), "--max-steps", str(steps), "--max-new-tokens", str(max_new_tokens),
            "--prompts-per-step", str(prompts), "--group-size", "8", "--eval-every", "0",
            "--gradient-checkpointing", "true", "--parallel", "fsdp", "--lr", "1e-6"]


def train(flags: list[str], run: Path, steps: int, on_step=None, cap: float | None = None) -> list[dict]:
    """Run train.py with `flags` into the folder `run` until step `steps` is logged; -> its
    metrics.jsonl rows, one per step, on_step(row) called as each is written. The run is stopped
    there, before its end-of-run checkpoint: a 1.5B model's fp32 weights and AdamW state are ~21 GB,
    whose writing took the rest of a GPU window on 2026-11-28. Past `cap` seconds, train.py (run
    with -X faulthandler) gets SIGABRT, on which it prints every thread's stack, the line it stalled
    on, and TimeoutError is raised."""
    command = [sys.executable, "-X", "faulthandler", "train.py", *flags, "--out", str(run)]
    proc, rows, metrics = subprocess.Popen(command, cwd=ROOT), [], run / "metrics.jsonl"
    deadline = None if cap is None else time.monotonic() + cap
    try:
        while len(rows) < steps:
            ended = proc.poll() is not None
            written = metrics.read_text().split("\n")[:-1] if metrics.is_file() else []  # whole lines only
            for line in written[len(rows):]:
                rows.append(json.loads(line))
                if on_step:
                    on_step(rows[-1])
            if ended and len(rows) < steps:
                raise subprocess.CalledProcessError(proc.returncode, command)
            if deadline is not None and time.monotonic() > deadline:
                proc.send_signal(signal.SIGABRT)
                proc.wait()
                raise TimeoutError(f"train.py {' '.join(flags)}: {len(rows)} of {steps} steps within its cap of "
                                   f"{cap:.0f} s (its stack above)")
            time.sleep(0.5)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    return rows


def plan_peaks(flags: list[str]) -> dict:
    """The memory plan's peak (GiB of tensors, one GPU) of the rollout and of the update phases for
    train.py `flags`: what train.py --plan true --world-size 1 prints, as numbers."""
    cfg = parse_config(flags)
    resident, phases = estimate(cfg, find_shape(cfg.model, cfg.trust_remote_code)[0], 1, "cuda")
    base = sum(n for _, n in resident)
    return {group: (base + max(ph.total for ph in phases if ph.group == group)) / GiB for group in ("rollout", "update")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="Qwen2.5-1.5B-Instruct", help="a folder name in assets/shapes/")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=1024)
    parser.add_argument("--prompts", type=int, default=16, help="prompts per step (× group size 8)")
    parser.add_argument("--out", default="runs/gpu-bench")
    parser.add_argument("train_flags", nargs="*", help="more train.py flags, after --")
    args = parser.parse_args()
    model_dir, run = Path(args.out) / args.shape, Path(args.out) / f"{args.shape}-run"
    if not (model_dir / "config.json").is_file():
        build(args.shape, model_dir)
    flags = recipe_flags(model_dir, args.steps, args.max_new_tokens, args.prompts) + args.train_flags
    rows = train(flags, run, args.steps)
    print(f"\n{args.shape}: {args.prompts} prompts × 8, {args.max_new_tokens}-token budget, bf16, FSDP")
    print("| step | rollout s | generated tok/s | update s | trained tok/s | rollout share | rollout peak GiB | "
          "update peak GiB |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['step']} | {r['time/rollout']:.1f} | {r['tokens/generated'] / r['time/rollout']:,.0f} | "
              f"{r['time/update']:.1f} | {r['tokens/forward'] / r['time/update']:,.0f} | "
              f"{r['time/rollout'] / (r['time/rollout'] + r['time/update']):.0%} | "
              f"{r.get('memory/rollout_peak_gib', float('nan')):.2f} | {r.get('memory/update_peak_gib', float('nan')):.2f} |")
    print(f"mean length {rows[-1]['length/mean']:.0f}, truncated {rows[-1]['length/truncated']:.2f}")
    subprocess.run([sys.executable, "train.py", *flags, "--plan", "true", "--world-size", "1"], cwd=ROOT)


if __name__ == "__main__":
    main()
