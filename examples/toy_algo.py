"""Toy: REINFORCE against the group mean, with the advantage capped at ±`toy_cap`.

A template for a new method: copy this file to algos/toy.py and add `"toy": ("toy",),` to MODULES
in algos/__init__.py. That is the whole change; config.py learns `--toy-cap` from KNOBS below.

    torchrun --nproc_per_node 2 train.py --algo toy --toy-cap 0.3

    advantage  A_i = clip(R_i − mean_g R, −toy_cap, toy_cap)
    per token  ℓ = −A · r,  r = exp(logp − logp_old): REINFORCE's gradient on-policy, no clip
    aggregate  token-mean over the mini-batch on all ranks (policy_gradient.aggregate, docs/math.md §0/§1),
               which also applies --beta, --tis-cap, --mis-cap and --top-entropy-quantile

Worked example (tests/test_fork.py): R = [1, 0, 0, 1], toy_cap 0.3 -> A = [0.3, −0.3, −0.3, 0.3];
on-policy the loss is −mean(A) = 0 and ∂loss/∂logp = −A_i / (number of tokens).
"""
from __future__ import annotations

import torch

from algos.base import Algorithm, Knob, LossInputs
from algos.policy_gradient import AGGREGATE_KNOBS, aggregate

PRESET = dict(mini_batches=1)
KNOBS = (Knob("toy_cap", 0.5, "toy: the advantage is clipped to [−cap, cap]", above=0), *AGGREGATE_KNOBS)


def advantages(scores: torch.Tensor, cfg) -> torch.Tensor:
    """scores [n_groups, G] -> A, same shape. [[1, 0, 0, 1]], cap 0.3 -> [[0.3, −0.3, −0.3, 0.3]]."""
    return (scores - scores.mean(1, keepdim=True)).clamp(-cfg.toy_cap, cfg.toy_cap)


def loss(mb: LossInputs, cfg, totals: dict):
    """−A·r per token, a share of the mini-batch's token-mean."""
    ratio = torch.exp(mb.logp - mb.old_logp)
    return aggregate(-mb.adv[:, None] * ratio, mb, cfg, totals, loss_agg="token-mean", metrics={})


ALGORITHMS = [Algorithm("toy", PRESET, advantages, loss, knobs=KNOBS)]
