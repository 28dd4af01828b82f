"""REINFORCE++-baseline: subtract the group mean, then whiten over every token of the batch.

docs/math.md §7. Paper: Hu et al. 2025, "REINFORCE++: An Efficient RLHF Algorithm with Robustness to
Both Prompt and Reward Models" (arXiv 2501.03262), the "-baseline" variant for reasoning (one
prompt, G samples). Read from verl `verl/trainer/ppo/core_algos.py` @ b178a3c
(compute_reinforce_plus_plus_baseline_outcome_advantage, then compute_policy_loss_vanilla).

    centre   ã_i = R_i − mean of its group's R       (a group of one keeps R_i)
    whiten   over all valid tokens of the whole rollout batch, each response counting its L_i tokens:
             μ = Σ_i L_i·ã_i / n,  σ² = Σ_i L_i·(ã_i − μ)² / n · n/(n − 1),  n = Σ_i L_i
             A_i = (ã_i − μ) / √(σ² + 1e-8)           (the same on every token of response i)
    loss     §1's PPO clip, ε 0.2/0.2 with dual clip c = 3, token-mean, plus β·k3 to the
             reference (β 0.001): algos/grpo.loss as is

Unlike GRPO there is no per-group std: a group whose rewards all agree has ã = 0 but still gets
A = −μ/σ after the batch whitening, and long responses weigh more in μ and σ. L_i counts the
tokens the loss trains on (a truncated response with mask_truncated counts 0). train.update
passes them because the algorithm declares `response_tokens` (algos/__init__.py).

Worked example (tests/test_algos_2025.py): R = [[1, 0, 0, 1], [0, 0, 0, 1]], L = [[3, 5, 2, 4],
[6, 1, 2, 5]]: ã = [[0.5, −0.5, −0.5, 0.5], [−0.25, −0.25, −0.25, 0.75]], n = 28,
μ = 0.0535714286, σ² = 0.2516534392, A = [[0.8899191, −1.1034997, −1.1034997, 0.8899191],
[−0.6051450, −0.6051450, −0.6051450, 1.3882738]].

Where we differ from the references, and why:
- σ² is unbiased (n/(n − 1)), as verl's masked_whiten; OpenRLHF uses the population variance. With
  a single valid token we skip the correction instead of raising as verl does.
- The KL to the reference is β·k3 in the loss (verl's use_kl_loss), not a per-token penalty
  folded into the reward as in the paper and OpenRLHF; β = 0.001 is verl's kl_loss_coef default.
"""
from __future__ import annotations

import torch

from algos import grpo, policy_gradient
from algos.base import Algorithm

PRESET = dict(clip_low=0.2, clip_high=0.2, dual_clip=3.0, loss_agg="token-mean", beta=0.001, mini_batches=1,
              weight_decay=0.01)  # verl's actor optimizer default
# its own advantage reads no adv_norm, std_estimator or adv_eps; the loss is grpo.loss
KNOBS = (*policy_gradient.CLIP_KNOBS, policy_gradient.DUAL_CLIP, policy_gradient.LOSS_AGG,
         *policy_gradient.AGGREGATE_KNOBS)


def advantages(scores: torch.Tensor, cfg, tokens: torch.Tensor) -> torch.Tensor:
    """scores and tokens [n_groups, G] (rewards; trained tokens per response) -> A, same shape.

    [[1, 0], [1, 1]] with tokens [[1, 1], [1, 1]]: ã = [[0.5, −0.5], [0, 0]], μ = 0,
    σ² = 0.125·4/3 = 1/6 -> A ≈ [[1.2247, −1.2247], [0, 0]].
    """
    centred = policy_gradient.advantages(scores, adv_norm="none")  # R − group mean; a group of one keeps R
    n = tokens.sum()
    mean = (tokens * centred).sum() / n.clamp(min=1)
    bessel = n / (n - 1) if n > 1 else 1.0  # verl's unbiased masked variance
    var = (tokens * (centred - mean) ** 2).sum() / n.clamp(min=1) * bessel
    return (centred - mean) / torch.sqrt(var + 1e-8)


ALGORITHMS = [Algorithm("reinforce_pp", PRESET, advantages, grpo.loss, knobs=KNOBS, response_tokens=True)]
