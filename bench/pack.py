"""The update alone, padded against packed (--pack), on 1 process and on 2 ranks (rows cut by count
against by real tokens), on the lengths a user meets.

    python bench/pack.py                  # ~5 minutes on 2 CPU cores
    python bench/pack.py --worlds 2 --repeats 5

Three batches of GRPO's default shape (16 prompts × 8, micro-batch 64, one optimizer step, the
shipped tiny model in fp32, AdamW), each timed through train.update alone (advantages, forwards,
backwards, the optimizer step; no rollout):
  default     the default task's own rollout: the shipped model on its running sums (HF generate,
              80 new tokens at most, temperature 1)
  long-tail   the same prompts with responses drawn like a math run's: 8 + 392·u⁴ tokens, u uniform
              (median 32, a tenth over 265, the longest at the 400-token budget)
  delethink   configs/tiny_delethink.yaml's own rollout: Markovian chunk rows (C = 32, m = 21, up to 7 chunks)
Each world runs its layouts interleaved (padded, packed, padded, ...) after one untimed update each,
in processes of its own (2 ranks: gloo, one thread each, as torchrun gives them); a row is the
median of --repeats updates of rank 0. Printed per row, each as a ratio to the padded run on the
same ranks in the same process: tokens in the forwards' tensors (layout/tensor_tokens), and seconds;
the padding share and the ranks' token spread (the busiest rank's real tokens over the mean) as they are.
"""
from __future__ import annotations

import argparse
import os
import pickle
import random
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def rollout(cfg) -> list:
    """The episodes of one training rollout of cfg's model on cfg's task (one process, seed 0)."""
    import torch

    import data
    from config import rollout_shapes, sampler_class
    from model import check_model_folder, load_model
    from rewards import grade_batch
    from rollout import Sampling, encode_prompts, generate
    torch.manual_seed(0)
    task, problems, _ = data.load(cfg)
    tokenizer, _ = check_model_folder(cfg.model)
    shape, _ = rollout_shapes(cfg, tokenizer)
    lm = load_model(cfg.model)
    batch = task.stream(problems, cfg.seed).get(0, cfg.prompts_per_step)
    sampling = Sampling(cfg.temperature, cfg.top_p, cfg.top_k, cfg.max_new_tokens, sampler=sampler_class(cfg).start(
        cfg, lm, 1, None))
    episodes = generate(lm, tokenizer, batch, encode_prompts(tokenizer, batch, cfg.chat_template),
                        group_size=cfg.group_size, sampling=sampling, shape=shape)
    for e, verdict in zip(episodes, grade_batch(task, [(e.problem, e.text) for e in episodes])):
        e.settle(verdict)
        e.score = e.reward
    return episodes


def long_tail(episodes: list, seed: int = 0, budget: int = 400) -> list:
    """The episodes' prompts (anything with prompt_ids, group and problem) with responses of
    8 + (budget − 8)·u⁴ random tokens, the reward a coin flip."""
    from rollout import Chunk, Episode
    rng = random.Random(seed)
    out = []
    for e in episodes:
        n = 8 + int((budget - 8) * rng.random() ** 4)
        response = [rng.randrange(3, 40) for _ in range(n - 1)] + [1]
        out.append(Episode(prompt_ids=e.prompt_ids, response_ids=response, text="", truncated=False,
                           group=e.group, problem=e.problem, chunks=[Chunk(e.prompt_ids, response)],
                           reward=float(rng.random() < 0.5)))
        out[-1].score = out[-1].reward
    return out


def child(rank: int, world: int, init: str, batches: str, repeats: int, out: str) -> None:
    """One rank: every batch's layouts, interleaved; rank 0 writes {(batch, layout): [(seconds, metrics)]}."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    if world > 1:
        dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    from config import parse_config
    from model import load_tokenizer
    from train import learner_for, update

    results = {}
    for name, (argv, episodes) in pickle.loads(Path(batches).read_bytes()).items():
        cfg = parse_config(argv)
        tokenizer = load_tokenizer(cfg.model)
        learners = {pack: learner_for(replace(cfg, pack=pack), None, tokenizer, [episodes[0].problem], rank, world,
                                      torch.device("cpu"))[0] for pack in (False, True)}
        for pack, learner in learners.items():  # warm-up
            update(learner, pickle.loads(pickle.dumps(episodes)))
        for _ in range(repeats):
            for pack, learner in learners.items():
                eps = pickle.loads(pickle.dumps(episodes))
                if world > 1:
                    dist.barrier()
                t = time.perf_counter()
                metrics = update(learner, eps)
                results.setdefault((name, pack), []).append((time.perf_counter() - t, metrics))
    if rank == 0:
        Path(out).write_bytes(pickle.dumps(results))
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="timed updates per layout (the median is shown)")
    parser.add_argument("--worlds", type=int, nargs="+", default=[1, 2], help="process counts")
    parser.add_argument("--rollouts", type=Path, help="a file that keeps the two rollouts (written if absent)")
    args = parser.parse_args()
    import torch.multiprocessing as mp

    from config import parse_config
    markov = ["--config", str(ROOT / "configs" / "tiny_delethink.yaml"), "--mini-batches", "1"]
    if args.rollouts and args.rollouts.is_file():
        default, chunked = pickle.loads(args.rollouts.read_bytes())
    else:
        default, chunked = rollout(parse_config([])), rollout(parse_config(markov))
        if args.rollouts:
            args.rollouts.write_bytes(pickle.dumps((default, chunked)))
    batches = {"default": ([], default), "long-tail": ([], long_tail(default)), "delethink": (markov, chunked)}
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "batches.pkl").write_bytes(pickle.dumps(batches))
        print(f"{'batch':10} {'ranks':>5} {'layout':>7} {'real tok':>9} {'tokens':>7} {'padding':>8} "
              f"{'spread':>7} {'seconds':>8} {'× time':>7}")
        for world in args.worlds:
            out = Path(tmp, f"results-{world}.pkl")
            mp.start_processes(child, args=(world, str(Path(tmp, f"init-{world}")), str(Path(tmp, "batches.pkl")),
                                            args.repeats, str(out)), nprocs=world, start_method="spawn")
            results = pickle.loads(out.read_bytes())
            for name in batches:
                padded = results[(name, False)]
                for pack in (False, True):
                    runs = results[(name, pack)]
                    m = runs[-1][1]
                    seconds = statistics.median(s for s, _ in runs)
                    base_tokens = padded[-1][1]["layout/tensor_tokens"]
                    print(f"{name:10} {world:5d} {'packed' if pack else 'padded':>7} {m['layout/real_tokens']:9.0f} "
                          f"{m['layout/tensor_tokens'] / base_tokens:7.3f} {m['layout/padding_share']:8.3f} "
                          f"{m['layout/rank_spread']:7.3f} {seconds:8.2f} "
                          f"{seconds / statistics.median(s for s, _ in padded):7.3f}")


if __name__ == "__main__":
    main()
