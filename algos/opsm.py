"""DeepSeek-V3.2's off-policy sequence mask and unbiased KL, on GRPO's clipped loss.

docs/math.md §11. Paper: DeepSeek-AI 2025, "DeepSeek-V3.2: Pushing the Frontier of Open Large Language
Models" (arXiv 2512.02556), §3.1, Eq. 9 (the mask) and the unbiased KL estimate before it. Read from TRL
`trl/trainer/grpo_trainer.py` @ f2cd577 (get_off_policy_mask, _compute_loss) and `grpo_config.py`
(off_policy_mask_threshold, use_bias_correction_kl), and TRL's docs/source/paper_index.md.

    mask     M_i = 0 if A_i < 0 and (1/L_i)·Σ_t m·(logp_old − sg(logp)) > δ, else 1: a response the policy
             now finds much less likely than when it was sampled, and that it is pushed away from
    loss     ℓ = M_i · max(−A·r, −A·clip(r, 1 − ε_low, 1 + ε_high)) (GRPO's, docs/math.md §1)
             + β · k3 · r when unbiased_kl (k3 = e^(ref − θ) − (ref − θ) − 1, r = π_θ/π_old, with gradient):
             k3 estimates KL(π_θ ‖ π_ref) only under π_θ's own samples; the ratio corrects it to π_old's
    defaults δ = 0.5, β = 1e-3 with unbiased_kl (TRL's docs: "a good starting point" and the example;
             the paper gives neither), token-mean (TRL's default loss_type "dapo"), ε = 0.2 both
             sides; group advantage; K = 4 mini-batches per rollout batch

On the first mini-batch θ = θ_old, so every mean log-ratio is 0 and nothing is masked: the mask
acts from the 2nd mini-batch on (K = 4, our choice as for GSPO), or where the sampler drifted.

Worked example (tests/test_algos_2026.py; docs/math.md §1's logp, logp_old, R = [1, 0, 0, 1], group
A = ±0.8660239, a reference 0.1 below logp_old): with δ = 0.05 and β = 0, response 1 (A < 0, mean
log π_old − log π = 0.1) is masked, loss = −0.2063259319; the preset (δ 0.5: none masked, β 1e-3,
unbiased) −0.0035175813; both TRL's numbers.

Where we differ from TRL, and why:
- π_old is the trainer's score of the sampling weights, as in TRL without vLLM; TRL with vLLM
  reads the sampler's own log-probs for the mask. Their gap is --tis-cap / --mis-cap here.
- max_chunks must be 1 and --env unset: the mask needs each whole response's mean log-ratio.
"""
from __future__ import annotations

import torch

from algos import policy_gradient
from algos.base import Algorithm, Knob, LossInputs, several_rows

KNOBS = (*policy_gradient.ADVANTAGE_KNOBS, *policy_gradient.CLIP_KNOBS, policy_gradient.DUAL_CLIP,
         policy_gradient.LOSS_AGG, *policy_gradient.AGGREGATE_KNOBS,
         Knob("off_policy_mask", 0.5, "δ: a response with A < 0 whose mean log π_old − log π exceeds δ is left out "
              "of the policy loss (DeepSeek-V3.2 Eq. 9; TRL off_policy_mask_threshold)", above=0),
         Knob("unbiased_kl", False, "the β KL term is k3 × π/π_old, DeepSeek-V3.2's unbiased estimate (TRL "
              "use_bias_correction_kl); needs beta > 0", choices=(True, False)))
PRESET = dict(adv_norm="group", clip_low=0.2, clip_high=0.2, loss_agg="token-mean", off_policy_mask=0.5,
              unbiased_kl=True, beta=1e-3, mini_batches=4)


def kept(mb: LossInputs, delta: float) -> torch.Tensor:
    """M [n]: 1.0 unless A < 0 and the row's mean log π_old − log π is over δ. Log-ratios (old − new)
    [[0.2, 0.4]], A −1, δ 0.25 -> [0.0]; the same with A 0 -> [1.0] (A ≥ 0 is never masked)."""
    drift = ((mb.old_logp - mb.logp.detach()) * mb.mask).sum(1) / mb.mask.sum(1).clamp(min=1)
    return ((mb.adv >= 0) | (drift <= delta)).to(mb.logp.dtype)


def loss(mb: LossInputs, cfg, totals: dict):
    """GRPO's clipped loss on the kept responses, a share of the global aggregation `cfg.loss_agg`.

    Reads logp, old_logp, mask, adv (and ref_logp when beta > 0, and what policy_gradient.aggregate reads).
    """
    per_token, was_clipped = policy_gradient.clipped_surrogate(
        mb.logp, mb.old_logp, mb.adv, clip_low=cfg.clip_low, clip_high=cfg.clip_high, dual_clip=cfg.dual_clip)
    m = kept(mb, cfg.off_policy_mask)[:, None]
    metrics = {"pg/clipfrac": policy_gradient.token_share(was_clipped, mb, totals),
               "opsm/masked_frac": policy_gradient.token_share(1 - m, mb, totals)}
    ratio = torch.exp(mb.logp - mb.old_logp) if cfg.unbiased_kl else None
    return policy_gradient.aggregate(per_token * m, mb, cfg, totals, loss_agg=cfg.loss_agg, metrics=metrics,
                                     kl_weight=ratio)


def check(cfg) -> str:
    """The mask needs each whole response in one row; the unbiased KL needs a KL term to correct."""
    if several_rows(cfg):
        return ("--algo opsm masks a response by its whole mean log-ratio, which a Markovian or multi-turn trace "
                "split over rows does not have in one row: set max_chunks 1, no --env")
    if cfg.unbiased_kl and cfg.beta == 0:
        return "unbiased_kl=True corrects the β KL term, which beta=0 leaves out: set --beta > 0 (e.g. 1e-3) or " \
               "--unbiased-kl false"
    return ""


ALGORITHMS = [Algorithm("opsm", PRESET, policy_gradient.batch_advantages, loss, knobs=KNOBS, check=check,
                        group_baseline=True)]
