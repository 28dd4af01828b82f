"""GDPO: each reward term normalised within its group before the terms are summed.

docs/math.md §9. Paper: Liu et al. (NVIDIA), "GDPO: Group reward-Decoupled Normalization Policy
Optimization for Multi-reward RL Optimization", arXiv 2601.05242 (Jan 2026). Read from NVlabs/GDPO
`trl-GDPO/trl-0.18.0-gdpo/trl/trainer/grpo_trainer.py` @ 41f74c5 (the block applied with more than
one reward) and `verl-GDPO/`.

With reward terms r_1..r_M and weights w_1..w_M (--reward-terms, grading/terms.py), over the step's
whole batch on all ranks:

    1. per term, per group   Â_j = (r_j − mean_g r_j) / (std_g r_j + 1e-4)
    2. weighted sum          P = Σ_j w_j Â_j
    3. over the batch        A = (P − mean_batch P) / (std_batch P + 1e-4)

both stds with Bessel's correction (n − 1). The loss is GRPO's (algos/grpo.py): the clipped surrogate
with the run's loss_agg. Why: summed first, R = Σ_j w_j r_j, distinct combinations of terms can give
one group normalised advantage; in the worked example (tests/test_gdpo.py, docs/math.md §9) the
response that is right and formatted gets what a merely formatted one gets, and GDPO tells them
apart. With one term the official code does not apply GDPO: it is then GRPO's group normalisation
with the unbiased std at GDPO's eps, 1e-4, of the run's reward.

Where we differ from the official code, and why: nothing in the advantage. A term's value is what
the Verdict of grading/terms.Weighted recorded (reward/<name>), so the score's shaping (an overlong
penalty, zero_truncated, a multi-turn trace's turn rewards) is not a term and is refused with two
terms or more.
"""
from __future__ import annotations

import functools
import os
import sys

import torch

from algos import grpo, policy_gradient
from algos.base import Algorithm

EPS = 1e-4  # GDPO's own, added to each std
PRESET = dict(clip_low=0.2, clip_high=0.2, loss_agg="seq-mean-token-mean")  # GRPO's: only the advantage differs
KNOBS = (*policy_gradient.CLIP_KNOBS, policy_gradient.DUAL_CLIP, policy_gradient.LOSS_AGG,
         *policy_gradient.AGGREGATE_KNOBS)


@functools.cache
def terms(spec: str) -> list:
    """--reward-terms' terms, read once a run (parse_terms reads each function's file), not at every step."""
    from grading.terms import parse_terms  # a run without --reward-terms never imports grading/

    return parse_terms(spec) if spec else []


def advantages(scores: torch.Tensor, cfg, episodes: list) -> torch.Tensor:
    """scores [n_groups, G] of the whole global batch (the weighted total R) and its episodes, whose
    details hold each term's value -> advantages [n_groups, G] (see the module docstring)."""
    chosen = terms(cfg.reward_terms)
    if len(chosen) < 2:
        return policy_gradient.advantages(scores, adv_norm="group", std_estimator="unbiased", eps=EPS)
    r = torch.tensor([[e.details[f"reward/{t.name}"] for t in chosen] for e in episodes], dtype=scores.dtype)
    r = r.view(*scores.shape, len(chosen)).movedim(-1, 0)  # [M, n_groups, G]
    per_term = (r - r.mean(-1, keepdim=True)) / (r.std(-1, keepdim=True) + EPS)
    weights = torch.tensor([t.weight for t in chosen], dtype=scores.dtype)
    summed = (weights[:, None, None] * per_term).sum(0)
    return (summed - summed.mean()) / (summed.std() + EPS)


def check(cfg) -> str:
    """The rule of the shaped score (module docstring), and a warning (rank 0) that one term or none is GRPO."""
    shaped = [name for name in ("overlong_penalty", "zero_truncated", "env") if getattr(cfg, name)]
    if len(terms(cfg.reward_terms)) < 2 and os.environ.get("RANK", "0") == "0":
        print(f"warning: --algo gdpo with {len(terms(cfg.reward_terms)) or 'no'} reward term(s) normalises one reward: "
              f"that is GRPO's group advantage at GDPO's eps {EPS:g}, as the official code does (docs/math.md §9); "
              f"give --reward-terms two terms or more to normalise them apart", file=sys.stderr, flush=True)
    if shaped and len(terms(cfg.reward_terms)) > 1:
        return (f"--algo gdpo normalises each reward term apart, and {', '.join(shaped)} shapes the summed score, "
                f"which no term holds: drop {', '.join(shaped)}, or give one term")
    return ""


ALGORITHMS = [Algorithm("gdpo", PRESET, advantages, grpo.loss, knobs=KNOBS, check=check, group_baseline=True,
                        reward_terms=True)]
