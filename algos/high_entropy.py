"""The 80/20 rule: train only on the high-entropy "forking" tokens (`--top-entropy-quantile ρ`).

docs/math.md §7. Paper: Wang et al. 2025, "Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive
Effective Reinforcement Learning for LLM Reasoning" (arXiv 2506.01939). Read from TRL
`trl/trainer/grpo_trainer.py` @ f2cd577 (get_high_entropy_mask, top_entropy_quantile).

    τ_H  = torch.quantile(entropies of the valid tokens, 1 − ρ), float32, linear interpolation
    keep = valid and H ≥ τ_H;  the policy loss of the other tokens is masked, but they stay in
           the loss's denominator (the token-mean still divides by every valid token)

ρ = 0.2 is the paper's (with the DAPO preset); 1.0 (the default) is off. For n distinct values
the mask keeps n − ⌈(1 − ρ)(n − 1)⌉ tokens: n = 10, ρ = 0.3 -> τ_H between the 7th and 8th
smallest -> 3 tokens.

Every algorithm here reads it (its knob, algos/base.py's TOP_ENTROPY_QUANTILE, sits in
policy_gradient.AGGREGATE_KNOBS and in ROVER's and PACS's knobs; this file is read only by a run that
sets it, through algos/select.py): train.update computes the mask over the mini-batch and passes it as
LossInputs.high_entropy, and each loss multiplies its per-token policy loss by it, TRL's
`per_token_loss * entropy_mask`: policy_gradient.aggregate for the GRPO family, GSPO, CISPO, SAPO,
Clip-Cov and KL-Cov, before the reference KL is added (so a masked token keeps its KL gradient, as
in TRL), and ROVER's squared error. PACS has no per-token loss (ψ is a sum over the response):
there the masked tokens' log-probs are detached, so ψ only moves through the high-entropy tokens of
a response. The logged `pg/loss` and `loss/total` are those of the masked loss.

Where we differ from TRL, and why:
- The entropies are those of the whole mini-batch on all ranks at the current weights (train.update
  scores it before the first micro-batch); TRL gathers one gradient-accumulation step's. Same
  reason as Clip-Cov's (docs/math.md §0): the update must not depend on the micro-batch split.
"""
from __future__ import annotations

import torch


def high_entropy(entropy: torch.Tensor, mask: torch.Tensor, rho: float) -> torch.Tensor:
    """Bool per token: valid and at least the (1 − ρ)-quantile of the valid tokens' entropies.

    entropy [0.1, 0.5, 0.3, 0.9, 7.0], mask [1, 1, 1, 1, 0], ρ = 0.5 -> τ_H = 0.4
    -> [False, True, False, True, False] (the padded token never counts).
    """
    valid = mask > 0
    if not valid.any():
        return valid
    threshold = torch.quantile(entropy[valid].float(), 1 - rho)
    return valid & (entropy >= threshold)
