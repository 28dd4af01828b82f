"""SAPO: a smooth gate on each token's ratio instead of PPO's hard clip.

docs/math.md §7. Paper: Gao et al. 2025, "Soft Adaptive Policy Optimization" (arXiv 2511.20347).
Read from verl `verl/trainer/ppo/core_algos.py` @ b178a3c (compute_policy_loss_sapo) and TRL
`trl/trainer/grpo_trainer.py` @ f2cd577 (loss_type="sapo").

    gate    f(r) = σ(τ·(r − 1)) · 4/τ,  τ = τ_pos if A > 0 else τ_neg,
            r = exp(clamp(logp − logp_old, ±20))
    loss    ℓ = −f(r) · A,  seq-mean-token-mean (global counts, docs/math.md §0)
    defaults τ_pos 1.0, τ_neg 1.05 (paper; τ_neg > τ_pos damps negative updates, which raise the
            logits of many unsampled tokens, a little faster); group advantage (§1 `group`);
            K = 4 mini-batches per rollout batch

The gate's slope, f'(r) = 4·σ(1 − σ), is 1 at r = 1 and falls off smoothly on both sides, so a
token far off-policy still passes a little gradient where PPO's clip would pass none. On-policy
(the first mini-batch) the value is −(2/τ)·A per token while the gradient is that of −A·r, i.e.
GRPO's; `sapo/grad_scale` logs the token-mean of ∂f/∂logp = 4σ(1 − σ)·r (1 on-policy). K = 4
is our choice, as for CISPO and GSPO (verl's SAPO example runs 8): the gate only acts off-policy.

Worked example (tests/test_algos_2025.py; docs/math.md §1's logp, logp_old, R = [1, 0, 0, 1], group
A = ±0.8660239): loss = −0.0490211493.

Where we differ from the references: nowhere in the formula. The aggregation is
seq-mean-token-mean whatever `loss_agg` says, as in verl and TRL; SAPO does not declare `loss_agg`
(nor the clip knobs: the gate replaces the clip), so config.validate refuses them when set.
"""
from __future__ import annotations

import torch

from algos import policy_gradient
from algos.base import Algorithm, Knob, LossInputs

PRESET = dict(adv_norm="group", sapo_tau_pos=1.0, sapo_tau_neg=1.05,
              mini_batches=4, weight_decay=0.01)  # verl's actor optimizer default
KNOBS = (*policy_gradient.ADVANTAGE_KNOBS, *policy_gradient.TURN_CREDIT_KNOBS,
         Knob("sapo_tau_pos", 1.0, "gate temperature where A > 0: ℓ = −σ(τ(r − 1))·4/τ·A", above=0),
         Knob("sapo_tau_neg", 1.05, "gate temperature where A ≤ 0 (larger: negative updates fade faster "
              "off-policy)", above=0),
         *policy_gradient.AGGREGATE_KNOBS)  # no clip, no dual clip, no loss_agg


def gate(ratio: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """f(r) = σ(τ(r − 1))·4/τ: 2/τ at r = 1, slope 1 there. r 1, τ 1 -> 2; r 1, τ 1.05 -> 1.904762."""
    return torch.sigmoid(tau * (ratio - 1)) * 4 / tau


def loss(mb: LossInputs, cfg, totals: dict):
    """−f(r)·A per token, a share of the global seq-mean-token-mean.

    Reads logp, old_logp, mask, adv (and what policy_gradient.aggregate reads).
    """
    ratio = torch.exp((mb.logp - mb.old_logp).clamp(-20.0, 20.0))
    a = mb.adv[:, None]
    tau = torch.where(a > 0, cfg.sapo_tau_pos, cfg.sapo_tau_neg).to(ratio.dtype)
    sig = torch.sigmoid(tau * (ratio - 1)).detach()
    metrics = {"sapo/grad_scale": policy_gradient.token_share(4 * sig * (1 - sig) * ratio.detach(), mb, totals)}
    return policy_gradient.aggregate(-gate(ratio, tau) * a, mb, cfg, totals, loss_agg="seq-mean-token-mean",
                                     metrics=metrics)


_GATE = "its smooth gate replaces the clip"
ALGORITHMS = [Algorithm("sapo", PRESET, policy_gradient.batch_advantages, loss, knobs=KNOBS, group_baseline=True,
                        norm=policy_gradient.batch_norm,
                        refuses={"loss_agg": "it always aggregates seq-mean-token-mean, as verl and TRL do",
                                 "clip_low": _GATE, "clip_high": _GATE, "dual_clip": _GATE})]
