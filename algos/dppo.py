"""DPPO: a trust region on the probability difference, not on the ratio (Binary-TV, Binary-KL).

docs/math.md §11. Paper: Qi et al. 2026, "Rethinking the Trust Region in LLM Reinforcement Learning"
(arXiv 2602.04879), with Kimi K2.5's squared log-ratio penalty (arXiv 2602.02276). Read from prime-rl
`src/prime_rl/trainer/rl/loss.py` @ 559b447 (default_loss_fn: its default loss is Binary-TV plus that
penalty; defaults in DefaultLossConfig, packages/prime-rl-configs/src/prime_rl/configs/trainer.py) and
verl `verl/trainer/ppo/core_algos.py` @ 1dda039 (compute_policy_loss_dppo_tv, _dppo_kl; verl-project/verl).

    p = e^logp, p_old = e^logp_old, r = exp(clamp(logp − logp_old, ±20))
    Binary-TV  a token is masked where A > 0 and p − p_old > δ_high, or A ≤ 0 and p − p_old < −δ_low
    Binary-KL  D = p_old·log(p_old/p) + (1 − p_old)·log((1 − p_old + 1e-8)/(1 − p + 1e-8)), the KL between
               the two Bernoullis "this token or another"; masked where A > 0, p > p_old and D > δ_high,
               or A ≤ 0, p < p_old and D > δ_low
    loss       ℓ = −keep·A·r + τ·(logp − logp_old)²,  token-mean (global counts, docs/math.md §0)
    defaults   dppo_tv: δ_low = δ_high = 0.2, τ = 1e-3 (prime-rl's default loss); dppo_kl: δ = 0.05, τ = 0
               (verl's DPPO example, examples/dppo_trainer/run_qwen3_30b_a3b_megatron.sh; verl has no τ);
               group advantage; K = 4 mini-batches per rollout batch

A mask only drops a token that moved too far in the direction its advantage pushes: p rising on a
positive token, falling on a negative one; a token that moved the other way keeps its gradient,
−A·r·∇logp. Unlike PPO's ratio clip, a rare token (p_old 0.01) may triple its probability and stay,
a common one (p_old 0.7) may not rise past 0.9. The penalty τ·(log r)² pulls every token back
toward π_old whatever the mask (its gradient 2τ·log r·∇logp is 0 on-policy). On the first mini-batch
θ = θ_old: nothing is masked and the loss is −token-mean(A), its gradient GRPO's; K = 4 is our
choice (as for CISPO, SAPO and GSPO) so that the mask acts on the tiny task.

Worked examples (tests/test_algos_2026.py) on docs/math.md §1's logp, logp_old, R = [1, 0, 0, 1]
(group A = ±0.8660239): dppo_tv with δ = 0.05 masks the 1st tokens of responses 0 and 3 (A > 0, p up
by 0.058 and 0.078), loss = 0.1517347280 with τ = 1e-3, prime-rl's number; dppo_kl with δ = 0.01 masks
response 3's 1st token alone, loss = 0.0719562336; both gradients are verl's.

Where the references differ, and what we follow:
- π_old. prime-rl has none of its own: its inference log-probs are both the ratio's denominator and
  the penalty's μ. verl's is the trainer's recomputed π_old, ours too (the gap to the sampler's own
  numbers is --tis-cap / --mis-cap, rollout.sampler_correction, as verl's rollout_is_weights).
- The loss value. prime-rl's is −A·r; verl's −A·sg(min(r, c))·logp, whose gradient is the same
  below c (verl's default c = 20, its DPPO example 10000). We follow prime-rl, with verl's
  clamp of log r at ±20 so that a masked token's r cannot overflow into a NaN gradient.
- τ. prime-rl's kl_tau, on dppo_tv as in its default loss; verl's DPPO has no such term, so
  dppo_kl starts at τ = 0 (set --kl-tau to add it). Against π_old the penalty is exactly 0 on the
  first mini-batch; prime-rl's, against the inference engine's log-probs, is not (numerics, async lag).
- δ for dppo_tv: prime-rl's 0.2; verl's example runs 0.15.
- The aggregation: token-mean, prime-rl's (its loss is summed and divided by the rl tokens) and
  verl's function default; verl's example runs seq-mean-token-sum-norm (--loss-agg).
"""
from __future__ import annotations

import torch

from algos import policy_gradient
from algos.base import Algorithm, Knob, LossInputs

BOUND = dict(above=0)  # a bound ≤ 0 masks every token that moves at all: no trust region is left
MASK_LOW = Knob("dppo_mask_low", 0.2, "δ_low: a token with A ≤ 0 is masked once its probability falls past "
                "this (TV: by δ; KL: binary KL over δ)", **BOUND)
MASK_HIGH = Knob("dppo_mask_high", 0.2, "δ_high: a token with A > 0 is masked once its probability rises past "
                 "this", **BOUND)
KL_TAU = Knob("kl_tau", 0.0, "τ: + τ·(log π − log π_old)² per token, the squared log-ratio to the sampling "
              "policy (Kimi K2.5; prime-rl's default 1e-3 on dppo_tv)", at_least=0)
KNOBS = (*policy_gradient.ADVANTAGE_KNOBS, *policy_gradient.TURN_CREDIT_KNOBS, MASK_LOW, MASK_HIGH, KL_TAU,
         policy_gradient.LOSS_AGG, *policy_gradient.AGGREGATE_KNOBS)
_COMMON = dict(adv_norm="group", loss_agg="token-mean", mini_batches=4)
PRESETS = {"dppo_tv": dict(_COMMON, dppo_mask_low=0.2, dppo_mask_high=0.2, kl_tau=1e-3),
           "dppo_kl": dict(_COMMON, dppo_mask_low=0.05, dppo_mask_high=0.05, kl_tau=0.0)}


def tv_masked(p, p_old, a, *, low: float, high: float) -> torch.Tensor:
    """Binary-TV: where p − p_old left [−δ_low, δ_high] on the side A pushes. p 0.9, p_old 0.6, A > 0,
    δ 0.2 -> True; the same with A < 0 -> False (the probability rose: the token keeps its gradient)."""
    return torch.where(a > 0, p - p_old > high, p - p_old < -low)


def kl_masked(p, p_old, a, *, low: float, high: float) -> torch.Tensor:
    """Binary-KL: where the Bernoulli KL of (p_old, 1 − p_old) to (p, 1 − p) exceeds δ on the side A pushes.
    p 0.9, p_old 0.6, A > 0: D = 0.6·log(0.6/0.9) + 0.4·log(0.4/0.1) = 0.3113 > 0.05 -> True."""
    d = p_old * (p_old.log() - p.log()) + (1 - p_old) * torch.log((1 - p_old + 1e-8) / (1 - p + 1e-8))
    return torch.where(a > 0, (d > high) & (p > p_old), (d > low) & (p < p_old))


MASKS = {"dppo_tv": tv_masked, "dppo_kl": kl_masked}


def loss_of(masked):
    """The loss of the variant whose mask is `masked` (tv_masked or kl_masked)."""
    def loss(mb: LossInputs, cfg, totals: dict):
        """−keep·A·r + τ·(log r)² per token, a share of the global aggregation `cfg.loss_agg` (token-mean).

        Reads logp, old_logp, mask, adv (and what policy_gradient.aggregate reads).
        """
        log_r = (mb.logp - mb.old_logp).clamp(-20.0, 20.0)
        a = mb.adv[:, None]
        with torch.no_grad():
            drop = masked(mb.logp.exp(), mb.old_logp.exp(), a, low=cfg.dppo_mask_low, high=cfg.dppo_mask_high)
        metrics = {"pg/clipfrac": policy_gradient.token_share(drop, mb, totals)}
        per_token = torch.where(drop, 0.0, -a * log_r.exp())
        total, metrics = policy_gradient.aggregate(per_token, mb, cfg, totals, loss_agg=cfg.loss_agg, metrics=metrics)
        if cfg.kl_tau > 0:  # a regulariser (Kimi K2.5): neither the entropy mask nor the IS weight scales it
            w = policy_gradient.token_weights(mb.mask, loss_agg=cfg.loss_agg, n_seqs=totals["seqs"],
                                              n_tokens=totals["tokens"], max_len=totals["max_len"],
                                              seq_tokens=mb.seq_tokens)
            total = total + cfg.kl_tau * (w * log_r ** 2).sum()
            metrics["dppo/log_ratio_sq"] = policy_gradient.token_share(log_r.detach() ** 2, mb, totals)
        return total, metrics
    return loss


ALGORITHMS = [Algorithm(name, preset, policy_gradient.batch_advantages, loss_of(MASKS[name]), knobs=KNOBS,
                        group_baseline=True, norm=policy_gradient.batch_norm,
                        refuses={k: "its trust region is the probability mask (--dppo-mask-low/high), not a "
                                    "ratio clip" for k in ("clip_low", "clip_high", "dual_clip")})
              for name, preset in PRESETS.items()]
