"""PSR, NSR and W-REINFORCE: reinforce only the correct responses, only the incorrect, or both.

docs/math.md §2. Paper: Zhu et al. 2025, "The Surprising Effectiveness of Negative Reinforcement in LLM
Reasoning" (arXiv 2506.01347). Official code: github.com/TianHongZXY/RLVR-Decomposed @ a5d4e7c,
`verl/trainer/ppo/core_algos.py` (compute_psr_nsr_outcome_advantage) and
`verl/trainer/ppo/ray_trainer.py` (fit, where the other responses are dropped).

    advantage   A_i = λ if response i is correct (s_i = 1), −1 if not — no baseline, no std
    psr         train only on the correct responses (λ = 1)
    nsr         train only on the incorrect responses
    w_reinforce train on all of them, λ = 0.1
    loss        §1's PPO clip (ε = 0.2 both sides), token-mean, no KL — algos/grpo.loss as is

PSR and NSR *drop* the other responses rather than zeroing them (the `train_on` knob, applied in
train.update after the advantages): the token-mean then divides by the kept tokens only, the
kept rows are rebalanced over ranks, and the number of mini-batches follows the kept rows. A step
that keeps no row is skipped on every rank and logged as `update/skipped`.

Where we differ from the official code, and why:
- λ (`positive_advantage_weight`, the official name) is 0.1 for w_reinforce as in the paper; the
  official yaml default of 1 would be plain ±1 REINFORCE.
- Entropy bonus: the paper says 1e-4, the official scripts 1e-3; `entropy_coef` defaults to 0 and
  train.update adds −entropy_coef · (token-mean entropy) to the loss when it is set.
- Mini-batches: the official ppo_mini_batch_size (256 prompts, 2048 responses) applies to the
  responses kept, so the last mini-batch of a step is smaller; ours cuts the kept responses into
  ceil(kept · K / (B · G)) mini-batches of equal size (whole groups), so K follows the kept rows
  the same way but every optimizer step sees about as many responses.
- Weight decay 0.01 (the preset) is the official code's default; the official prompt is the
  Qwen chat format written by hand (`--prompt-template nsr --chat-template false`).
- "Correct" means score > 0: with the built-in 0/1 rewards that is s = 1. (If the DAPO overlong
  penalty is switched on, a correct response it pushes to score 0 counts as incorrect.)
"""
from __future__ import annotations

import torch

from algos import grpo, policy_gradient
from algos.base import Algorithm, Knob

# weight decay 0.01: the official code's default (verl/workers/fsdp_workers.py), which its script keeps
_PPO_TOKEN_MEAN = dict(clip_low=0.2, clip_high=0.2, loss_agg="token-mean", beta=0.0, weight_decay=0.01)
PRESETS = {
    "psr": dict(train_on="correct", positive_advantage_weight=1.0, **_PPO_TOKEN_MEAN),
    "nsr": dict(train_on="incorrect", **_PPO_TOKEN_MEAN),
    "w_reinforce": dict(train_on="all", positive_advantage_weight=0.1, **_PPO_TOKEN_MEAN),
}
POSITIVE_ADVANTAGE_WEIGHT = Knob("positive_advantage_weight", 0.1, "λ: advantage of a correct response "
                                 "(W-REINFORCE 0.1; PSR 1)")
# no adv_norm, std_estimator or adv_eps: the advantage is ±1 (or λ), not normalised
KNOBS = (POSITIVE_ADVANTAGE_WEIGHT, *policy_gradient.CLIP_KNOBS, policy_gradient.DUAL_CLIP, policy_gradient.LOSS_AGG,
         *policy_gradient.AGGREGATE_KNOBS)


def advantages(scores: torch.Tensor, cfg) -> torch.Tensor:
    """λ for correct, −1 for incorrect; no baseline. [[1, 0, 0, 1]], λ = 0.1 -> [[0.1, −1, −1, 0.1]]."""
    positive = torch.full_like(scores, cfg.positive_advantage_weight)
    return torch.where(scores > 0, positive, -torch.ones_like(scores))


ALGORITHMS = [Algorithm(name, preset, advantages, grpo.loss, knobs=KNOBS) for name, preset in PRESETS.items()]
