"""The tail that every per-token policy loss of SPEC §7 shares (gspo, cispo, sapo, clip_cov, kl_cov).

A loss computes its surrogate ℓ [n, T] per token; `aggregate` then, in this order,
    ℓ ← ℓ · is_weight     when train.update supplies mb["is_weight"] (truncated importance weights of
                          the trainer vs the sampler): the policy term only, as verl applies
                          rollout_is_weights to pg_losses before it adds anything else
    ℓ ← ℓ + β · k3        the KL to a frozen reference, only when cfg.beta > 0 (SPEC §1)
    loss = Σ w · ℓ        w from grpo.token_weights: the counts of the whole mini-batch on all ranks
and returns the loss with the method's metrics plus "pg/loss" (and "kl/k3").
"""
from __future__ import annotations

import torch

from algos import grpo


def aggregate(per_token: torch.Tensor, mb: dict, cfg, totals: dict, *, loss_agg: str,
              metrics: dict) -> tuple[torch.Tensor, dict]:
    """Σ w·ℓ over a micro-batch, a share of the mini-batch's loss (see algos/grpo.loss).

    ℓ [[1, 2, 0]], mask [[1, 1, 0]], "token-mean" over 4 tokens of the mini-batch -> (1 + 2) / 4.
    """
    w = grpo.token_weights(mb["mask"], loss_agg=loss_agg, n_seqs=totals["seqs"], n_tokens=totals["tokens"],
                           max_len=totals["max_len"], seq_tokens=mb.get("seq_tokens"))
    if mb.get("is_weight") is not None:
        per_token = per_token * mb["is_weight"]
    metrics = {"pg/loss": (w * per_token).sum().detach(), **metrics}
    if cfg.beta > 0:  # not weighted: the reference KL is a regulariser, not a sampled estimate
        kl = grpo.k3_kl(mb["logp"], mb["ref_logp"])
        metrics["kl/k3"] = (mb["mask"] * kl).sum().detach() / max(totals["tokens"], 1)
        per_token = per_token + cfg.beta * kl
    return (w * per_token).sum(), metrics


def token_share(x: torch.Tensor, mb: dict, totals: dict) -> torch.Tensor:
    """The micro-batch's share of the token-mean of x over the mini-batch's valid tokens (of a flag:
    the fraction where it holds). x [[1, 0, 1]], mask [[1, 1, 0]], 4 valid tokens in all -> 1/4."""
    return (mb["mask"] * x).sum().detach() / max(totals["tokens"], 1)
