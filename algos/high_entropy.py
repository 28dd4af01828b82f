"""The 80/20 rule: train only on the high-entropy "forking" tokens (`--top-entropy-quantile ρ`).

SPEC.md §7. Paper: Wang et al. 2025, "Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive
Effective Reinforcement Learning for LLM Reasoning" (arXiv 2506.01939). Read from TRL
`trl/trainer/grpo_trainer.py` @ f2cd577 (get_high_entropy_mask, top_entropy_quantile).

    τ_H  = torch.quantile(entropies of the valid tokens, 1 − ρ), float32, linear interpolation
    keep = valid and H ≥ τ_H;  the policy loss of the other tokens is masked, but they stay in
           the loss's denominator (the token-mean still divides by every valid token)

ρ = 0.2 is the paper's (with the DAPO preset); 1.0 (the default) is off. For n distinct values
the mask keeps n − ⌈(1 − ρ)(n − 1)⌉ tokens: n = 10, ρ = 0.3 -> τ_H between the 7th and 8th
smallest -> 3 tokens.

It works with every algorithm because train.update applies it to the gradient, not to any one
loss: logp of a masked token is detached before the loss sees it. For every per-token loss here
(the GRPO family, GSPO, CISPO, SAPO, Clip-Cov, KL-Cov, ROVER) that is exactly TRL's
`per_token_loss * entropy_mask` as far as the gradient goes; for PACS it means ψ only moves
through the high-entropy tokens of a response.

Where we differ from TRL, and why:
- The entropies are those of the whole mini-batch on all ranks at the current weights (train.update
  scores it before the first micro-batch); TRL gathers one gradient-accumulation step's. Same
  reason as Clip-Cov's (SPEC §0): the update must not depend on the micro-batch split.
- The masked tokens' loss still shows in `loss/total` (only their gradient is gone), and with
  β > 0 their reference-KL gradient goes too (TRL masks before adding the KL).
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
