"""Token choices that need the whole mini-batch: Clip-Cov's and KL-Cov's high-covariance tokens
(Algorithm.select_tokens, algos/cov.py) and the `--top-entropy-quantile` mask (algos/high_entropy.py).

docs/math.md §7. Both are computed from statistics of the whole mini-batch on all ranks at the
current weights, not per micro-batch as verl and TRL do, so the update does not depend on how
the mini-batch is split over ranks and micro-batches. train.update calls `token_flags` once per
mini-batch with its scorer outputs and the gather it runs on (parallel.gather_objects), and hands
each micro-batch its flags as LossInputs.selected / LossInputs.high_entropy.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from algos.high_entropy import high_entropy


def chunk_start(e, c) -> int:
    """Where row c's tokens start in its trace e's response: 0 for a one-row episode; for a later
    chunk of a Markovian trace, the tokens of the chunks before it (chunks of 3, 2, 4 -> 0, 3, 5)."""
    start = 0
    for x in e.chunks:
        if x is c:
            return start
        start += len(x.response_ids)
    return 0


def token_flags(algo, cfg, mb_episodes: list, micro: list, current: list, olds: list, *, in_loss: list[bool],
                seed: int, gather: Callable[[list], list[list]]) -> list[dict]:
    """Per-token flags of this rank's micro-batches: "selected", Clip-Cov's / KL-Cov's choice
    (algo.select_tokens), and "high_entropy", the --top-entropy-quantile mask, as bool [n, T] per
    micro-batch (an empty micro-batch's stand-in row gets all False).

    mb_episodes: the mini-batch's responses (rollout.Episode) on all ranks, with in_loss, whether
    the loss sees each; micro: this rank's micro-batches of (episode, chunk) rows; current / olds:
    its scorer outputs per micro-batch at the current weights and at π_old; gather: this rank's
    list -> every rank's lists. The mini-batch's response tokens are laid end to end, response after
    response (a trace's chunks in order); each rank fills in its own rows and gathers the others',
    so every rank computes the flags from the same flat tensors, in an order that depends neither on
    the number of ranks nor on the micro-batch split: with responses of 3 and 2 tokens, the second
    one's tokens are positions 3 and 4 wherever its row was scored. select_tokens draws from one
    generator seeded by `seed`, alike on every rank.
    """
    starts = dict(zip(map(id, mb_episodes), np.cumsum([0] + [len(e.response_ids) for e in mb_episodes]).tolist()))
    at = [[starts[id(e)] + chunk_start(e, c) for e, c in rows] for rows in micro]
    mine = []  # (first position, [3, L]: logp, old_logp, entropy) of each row this rank scored
    for rows, out, old, pos in zip(micro, current, olds, at):
        for r, ((_, c), a) in enumerate(zip(rows, pos)):
            n = len(c.response_ids)
            mine.append((a, torch.stack([out["logp"][r, :n], old["logp"][r, :n], out["entropy"][r, :n]]).cpu()))
    flat = torch.zeros(3, sum(len(e.response_ids) for e in mb_episodes))
    for part in gather(mine):
        for a, values in part:
            flat[:, a:a + values.shape[1]] = values

    def per_response(values):  # a response's value on each of its tokens
        return torch.cat([torch.full((len(e.response_ids),), float(v)) for e, v in zip(mb_episodes, values)])

    tokens = {**dict(zip(("logp", "old_logp", "entropy"), flat)),
              "adv": torch.cat([torch.full((len(c.response_ids),), e.row_advantage(c))
                                for e in mb_episodes for c in e.rows()]),
              "mask": per_response(in_loss)}
    picked = {}
    if algo.select_tokens is not None:
        picked["selected"] = algo.select_tokens(tokens, cfg, torch.Generator().manual_seed(seed))
    if cfg.top_entropy_quantile < 1:
        picked["high_entropy"] = high_entropy(tokens["entropy"], tokens["mask"], cfg.top_entropy_quantile)
    flags = [{name: torch.zeros_like(out["logp"], dtype=torch.bool) for name in picked} for out in current]
    for rows, pos, f in zip(micro, at, flags):  # back to this rank's rows
        for r, ((_, c), a) in enumerate(zip(rows, pos)):
            n = len(c.response_ids)
            for name, p in picked.items():
                f[name][r, :n] = p[a:a + n]
    return flags
