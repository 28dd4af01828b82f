"""Markovian thinking on the tiny model: Delethink vs LongCoT at the same chunk size C, then
test-time scaling (docs/math.md §5), as reported in the README.

    python bench/delethink_demo.py            # two training runs on 2 ranks + evals, ~10 min

1. Delethink: `torchrun train.py --config configs/tiny_delethink.yaml` — running sums whose
   full responses are up to 2·C tokens, written in chunks of C with m carried over, I chunks at most.
2. LongCoT capped at C: the same run with --max-chunks 1 (one chunk of C tokens, no carryover).
3. Test-time scaling: the start model and the Delethink checkpoint on the longest training
   problems and on longer ones (--tts-terms), with the chunk cap I raised beyond its training value.
Prints Markdown tables; the runs' logs stay in runs/delethink-demo/.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from eval import evaluate  # noqa: E402
from model import load_model, load_tokenizer  # noqa: E402
from tasks import RunningSumTask, builtin_splits  # noqa: E402
from environments.markovian import Markovian, chunking  # noqa: E402
from config import eval_settings, parse_config, rollout_shapes  # noqa: E402
from rollout import Generate  # noqa: E402

CONFIG = "configs/tiny_delethink.yaml"


def train(out: Path, *extra: str) -> tuple[list[dict], float]:
    """(eval rows of metrics.jsonl, wall seconds) of one 2-rank training run."""
    t0 = time.perf_counter()
    with (out.parent / f"{out.name}.log").open("w") as log:
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "train.py",
                        "--config", CONFIG, "--out", str(out), *extra],
                       cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=log)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "eval/accuracy" in r], time.perf_counter() - t0


def scaling(model: str, terms: tuple[int, int], caps: list[int], problems: int, samples: int) -> list[dict]:
    """Eval metrics of `model` on running sums of `terms` terms, one dict per chunk cap I."""
    cfg = parse_config(["--config", CONFIG])
    task = RunningSumTask(*terms, cfg.sum_digits)
    heldout = builtin_splits(task)[1][:problems]
    tok, lm = load_tokenizer(model), load_model(model)
    cfg.eval_samples, cfg.eval_k = samples, [1]
    out = []
    for cap in caps:
        cfg.eval_max_chunks = cap
        out.append(evaluate(lm, tok, task, heldout, **eval_settings(cfg, rollout_shapes(cfg, tok)[1], Generate()))[0])
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tts-terms", default="8,8", help="fewest,most terms of the test-time-scaling problems")
    parser.add_argument("--tts-caps", default="7,9,11,13", help="chunk caps I to evaluate them with")
    parser.add_argument("--tts-problems", type=int, default=200)
    parser.add_argument("--tts-samples", type=int, default=4)
    args = parser.parse_args()
    base = ROOT / "runs" / "delethink-demo"
    base.mkdir(parents=True, exist_ok=True)
    cfg = parse_config(["--config", CONFIG])
    c, m, cap = cfg.max_new_tokens, chunking(cfg).carryover, cfg.max_chunks

    rows = ["| run | chunks I | thinking budget | eval/accuracy before → after | truncated after | wall |",
            "|---|---|---|---|---|---|"]
    for name, extra, chunks in (("delethink", [], cap), ("longcot", ["--max-chunks", "1"], 1)):
        evals, wall = train(base / name, *extra)
        rows.append(f"| {name} | {chunks} | {chunking(cfg).max_tokens(c) if chunks > 1 else c} | "
                    f"{100 * evals[0]['eval/accuracy']:.1f}% → {100 * evals[-1]['eval/accuracy']:.1f}% | "
                    f"{100 * evals[-1]['eval/truncated']:.0f}% | {wall / 60:.1f} min |")
        print(rows[-1], flush=True)
    print(f"\nC = {c}, m = {m}, {cfg.sum_min_terms}-{cfg.sum_max_terms} terms, I = {cap} in training\n")
    print("\n".join(rows))

    terms = tuple(int(x) for x in args.tts_terms.split(","))
    caps = [int(x) for x in args.tts_caps.split(",")]
    torch.set_num_threads(2)
    table = {"start model": scaling(cfg.model, terms, caps, args.tts_problems, args.tts_samples),
             "after Delethink": scaling(str(base / "delethink" / "checkpoints" / f"step-{cfg.max_steps}"),
                                        terms, caps, args.tts_problems, args.tts_samples)}
    print(f"\ntest-time scaling on {terms[0]}-{terms[1]} terms, accuracy (truncated) vs the chunk cap I:\n")
    print("| model | " + " | ".join(f"I = {i} ({Markovian(m, cfg.chunk_head, i).max_tokens(c)} tokens)"
                                   for i in caps) + " |")
    print("|---" * (len(caps) + 1) + "|")
    for name, results in table.items():
        print(f"| {name} | " + " | ".join(f"{100 * r['eval/accuracy']:.1f}% ({100 * r['eval/truncated']:.0f}%)"
                                          for r in results) + " |")


if __name__ == "__main__":
    main()
