"""CISPO: clip the importance-sampling weight, never the token's gradient.

docs/math.md §7. Paper: MiniMax 2025, "MiniMax-M1: Scaling Test-Time Compute Efficiently with
Lightning Attention" (arXiv 2506.13585), §3.1. Read from verl `verl/trainer/ppo/core_algos.py`
@ b178a3c (compute_policy_loss_cispo) and TRL `trl/trainer/grpo_trainer.py` @ f2cd577
(loss_type="cispo").

    weight  w = sg(clip(r, 1 − ε_low, 1 + ε_high)),  r = exp(clamp(logp − logp_old, ±20))
    loss    ℓ = −w · A · logp    (REINFORCE with a clipped, detached IS weight), token-mean
    defaults ε_high 0.2 and no lower bound (ε_low 10, as verl's CISPO example: the paper tunes
            ε_high only); group advantage (§1 `group`); K = 4 mini-batches per rollout batch

PPO's clip drops the gradient of a token whose ratio left the trust region; CISPO keeps every
token's gradient and only caps how much it counts: ∂loss/∂logp = −w·A / N_tok. The loss *value*
is −w·A·logp, not a surrogate that equals −A on-policy, so `pg/loss` reads differently from
GRPO's. On the first mini-batch w = 1: token-mean REINFORCE. K = 4 is our choice (the paper
does not fix it; verl's example runs 2) so that the weight clip acts on the tiny task.

Worked example (tests/test_algos_2025.py; docs/math.md §1's logp, logp_old, R = [1, 0, 0, 1], group
A = ±0.8660239): only response 2's 2nd token has r > 1.2 (r = e^0.2) and gets w = 1.2;
loss = −0.0522600107.

Where we differ from the references, and why:
- TRL caps r at an absolute ε_high (recommended 5.0) and has no lower bound: that is ε_high = 4
  here. We keep verl's relative bounds so that `clip_high` means the same in every preset.
"""
from __future__ import annotations

import torch

from algos import policy_gradient
from algos.base import Algorithm, LossInputs

PRESET = dict(adv_norm="group", clip_low=10.0, clip_high=0.2, loss_agg="token-mean", mini_batches=4,
              weight_decay=0.01)  # verl's actor optimizer default
KNOBS = (*policy_gradient.ADVANTAGE_KNOBS, *policy_gradient.TURN_CREDIT_KNOBS, *policy_gradient.CLIP_KNOBS,
         policy_gradient.LOSS_AGG, *policy_gradient.AGGREGATE_KNOBS)  # no dual clip


def loss(mb: LossInputs, cfg, totals: dict):
    """−sg(w)·A·logp per token, a share of the global aggregation `cfg.loss_agg` (token-mean).

    Reads logp, old_logp, mask, adv (and what policy_gradient.aggregate reads).
    """
    ratio = torch.exp((mb.logp - mb.old_logp).clamp(-20.0, 20.0))
    w = ratio.clamp(1 - cfg.clip_low, 1 + cfg.clip_high).detach()
    metrics = {"pg/clipfrac": policy_gradient.token_share(w != ratio, mb, totals)}
    return policy_gradient.aggregate(-w * mb.adv[:, None] * mb.logp, mb, cfg, totals,
                                     loss_agg=cfg.loss_agg, metrics=metrics)


ALGORITHMS = [Algorithm("cispo", PRESET, policy_gradient.batch_advantages, loss, knobs=KNOBS, group_baseline=True,
                        norm=policy_gradient.batch_norm,
                        refuses={"dual_clip": "every token keeps its gradient; only the weight is clipped"})]
