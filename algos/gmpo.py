"""GMPO: the geometric mean of the token ratios, each clipped in log space by the sign of A.

docs/math.md §11. Paper: Zhao et al. 2025, "Geometric-Mean Policy Optimization" (arXiv 2507.20673).
Read from TRL `trl/experimental/gmpo/gmpo_trainer.py` and `gmpo_config.py` @ f2cd577 (GMPOTrainer) and
verl `verl/trainer/ppo/core_algos.py` @ 1dda039 (compute_policy_loss_geo_mean; verl-project/verl).

    log r_t   = logp − logp_old;  c_t = clamp(log r_t, −ε_low, ε_high)
    clipped   ĉ_t = min(log r_t, c_t) if A > 0 else max(log r_t, c_t)   (PPO's min, in log space)
    sequence  w_i = exp(Σ_t m·ĉ_t / max(Σ_t m, 1)),  m = mask (× the 80/20 mask, when asked)
    loss      ℓ_i = −w_i·A_i, a plain mean over the mini-batch's responses (global count, docs/math.md §0)
    defaults  ε_low = ε_high = 0.4 (ratios within e^±0.4, TRL's default and the paper's); group advantage;
              K = 4 mini-batches per rollout batch

A token whose ratio left the range on the side its advantage pushes stops passing gradient, as
in PPO; the others each pass w_i·A_i/L_i·∇logp: the geometric mean damps one outlier ratio, which
an arithmetic mean (GRPO's token sum) passes whole. On-policy w = 1, the loss is −mean(A) and the
gradient GRPO's seq-mean-token-mean one. K = 4 is our choice, as for GSPO.

Worked example (tests/test_algos_2026.py; docs/math.md §1's logp, logp_old, R = [1, 0, 0, 1], group
A = ±0.8660239): with ε = 0.15, response 1's 3rd token (log r = −0.3, A < 0) is clipped to −0.15 and
passes no gradient, response 2's 2nd (log r = 0.2, A < 0) is not; loss = 0.0004812358, TRL's number.

Where TRL and verl differ, and what we follow (TRL, which names GMPO a trainer):
- The 80/20 mask (--top-entropy-quantile) leaves low-entropy tokens out of the geometric mean
  (TRL), rather than multiplying the sequence's loss at each token.
- verl divides by Σm + 1e-8 where TRL clamps Σm at 1: equal to 1e-8 relative.
- Sampler/trainer weights (--tis-cap, --mis-cap) enter as their geometric mean over the response,
  exp(Σ m·log(w + 1e-10) / Σm), verl's rule; TRL's GMPO applies none.
- A response masked whole (--mask-truncated) leaves the mean and its count, as for every loss
  here (docs/math.md §0); TRL keeps its zero-gradient −A in the mean over the batch.
- max_chunks must be 1 and --env unset: the geometric mean is over the whole response, which a
  Markovian or multi-turn trace split over rows does not have in one row (as GSPO).
"""
from __future__ import annotations

from dataclasses import replace

import torch

from algos import policy_gradient
from algos.base import Algorithm, Knob, LossInputs, several_rows

PRESET = dict(adv_norm="group", log_clip_low=0.4, log_clip_high=0.4, mini_batches=4)
KNOBS = (*policy_gradient.ADVANTAGE_KNOBS,
         Knob("log_clip_low", 0.4, "ε_low: a token's log-ratio clipped below at −ε_low (ratio e^−ε_low) where "
              "A < 0", at_least=0),
         Knob("log_clip_high", 0.4, "ε_high: a token's log-ratio clipped above at ε_high where A > 0", at_least=0),
         *policy_gradient.AGGREGATE_KNOBS)  # no ratio clip, no dual clip, no loss_agg


def geometric_mean(log_x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """exp of the masked mean of log_x over each row, 1 for an empty row. [[ln 2, ln 8, 5]], mask [[1, 1, 0]] -> [4]."""
    return torch.exp((log_x * mask).sum(1) / mask.sum(1).clamp(min=1))


def loss(mb: LossInputs, cfg, totals: dict):
    """−w_i·A_i on every token of response i, a share of the global mean over responses.

    Reads logp, old_logp, mask, adv (and what policy_gradient.aggregate reads).
    """
    log_r = mb.logp - mb.old_logp
    a = mb.adv[:, None]
    bounded = log_r.clamp(-cfg.log_clip_low, cfg.log_clip_high)
    clipped = torch.where(a > 0, torch.minimum(log_r, bounded), torch.maximum(log_r, bounded))
    kept = mb.mask if mb.high_entropy is None else mb.mask * mb.high_entropy
    seq_loss = -geometric_mean(clipped, kept) * mb.adv
    if mb.is_weight is not None:  # verl: the sampler/trainer weights' geometric mean over the response
        seq_loss = seq_loss * geometric_mean(torch.log(mb.is_weight + 1e-10), mb.mask)
    region = ((log_r > cfg.log_clip_high) & (a > 0)) | ((log_r < -cfg.log_clip_low) & (a < 0))
    metrics = {"pg/clipfrac": policy_gradient.token_share(region, mb, totals)}
    # every token carries its response's loss: seq-mean-token-mean weights sum it to the mean over responses
    return policy_gradient.aggregate(seq_loss[:, None].expand_as(log_r), replace(mb, high_entropy=None, is_weight=None),
                                     cfg, totals, loss_agg="seq-mean-token-mean", metrics=metrics)


def check(cfg) -> str:
    """A trace spread over several rows (Markovian, multi-turn) has no whole-response mean in any one row."""
    if not several_rows(cfg):
        return ""
    return ("--algo gmpo takes the geometric mean over each whole response, which a Markovian or multi-turn trace "
            "split over rows does not have in one row: set max_chunks 1, no --env")


_LOG_CLIP = "it clips each token's log-ratio (--log-clip-low/high), not the ratio"
ALGORITHMS = [Algorithm("gmpo", PRESET, policy_gradient.batch_advantages, loss, knobs=KNOBS, check=check,
                        group_baseline=True,
                        refuses={"loss_agg": "it always takes the plain mean over responses, as TRL and verl do",
                                 "clip_low": _LOG_CLIP, "clip_high": _LOG_CLIP, "dual_clip": _LOG_CLIP})]
