"""Held-out evaluation: accuracy (avg@n) and unbiased pass@k (SPEC §6).

`train.py` calls `evaluate` for its periodic eval; the same function serves a stand-alone run.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

from rollout import Chunking, Sampling, encode_prompts, generate


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of Chen et al. (2021) for one problem with n samples, c of them correct.
    n=4, c=2: k=1 -> 0.5, k=2 -> 0.833333."""
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


@torch.no_grad()
def evaluate(lm, tokenizer, task, problems, *, n: int, ks: list[int], sampling: Sampling,
             chat_template: bool, seed: int, chunking: Chunking = Chunking(),
             batch_prompts: int = 64) -> dict:
    """Sample n responses per problem, grade them, and return flat metrics:
    eval/accuracy (mean correctness of all samples = pass@1 estimated with n), eval/pass@k,
    eval/length, eval/truncated. With Markovian thinking, `chunking.max_chunks` is the cap I
    (test-time scaling: larger than in training). Problems are split over ranks; counts are
    summed over ranks."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    torch.manual_seed(seed + rank)  # the same draws at every eval, so the curve compares like with like
    mine = problems[rank::world]
    sums = torch.zeros(3 + len(ks), dtype=torch.float64)  # accuracy, length, truncated, pass@k...
    for s in range(0, len(mine), batch_prompts):
        chunk = mine[s:s + batch_prompts]
        episodes = generate(lm, tokenizer, chunk, encode_prompts(tokenizer, chunk, chat_template),
                            group_size=n, sampling=sampling, chunking=chunking)
        correct = [task.grade(e.problem, e.text) for e in episodes]
        for j in range(len(chunk)):
            c = int(sum(correct[j * n:(j + 1) * n]))
            sums[0] += c / n
            sums[3:] += torch.tensor([pass_at_k(n, c, k) for k in ks], dtype=torch.float64)
        sums[1] += sum(len(e.response_ids) for e in episodes) / n
        sums[2] += sum(e.truncated for e in episodes) / n
    if world > 1:
        sums = sums.to(next(lm.parameters()).device)  # NCCL reduces only GPU tensors
        dist.all_reduce(sums)
    total = len(problems)
    out = {"eval/accuracy": sums[0].item() / total, "eval/length": sums[1].item() / total,
           "eval/truncated": sums[2].item() / total}
    out.update({f"eval/pass@{k}": sums[3 + i].item() / total for i, k in enumerate(ks)})
    return out
