"""Clip-Cov and KL-Cov: hold back the few tokens whose covariance drives entropy collapse.

docs/math.md §7. Paper: Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning
Language Models" (arXiv 2505.22617); code PRIME-RL/Entropy-Mechanism-of-RL, as merged into verl
`verl/trainer/ppo/core_algos.py` @ b178a3c (compute_policy_loss_clip_cov, compute_policy_loss_kl_cov).

Under policy gradient the entropy falls by about the covariance of a token's log-prob and its
advantage, so both methods pick tokens by

    cov_t = (A_t − mean A)·(logp_t − mean logp)     means over the valid tokens of the mini-batch,
                                                    logp the current policy's, detached
    clip_cov  ℓ⁰ = max(−A·r, −A·clip(r, 1 − ε_low, 1 + ε_high))  (r unclamped, no dual clip);
              candidates C = {valid, not clipped by ℓ⁰, lb < cov < ub}; k = max(⌊ratio·Σm⌋, 1);
              min(k, |C|) tokens drawn uniformly from C get ℓ = 0 (no gradient, still counted)
    kl_cov    ℓ = −A·r on every token (no clip at all); the top-k tokens by cov,
              k = max(⌊ratio·Σm⌋, 1), get ℓ = −A·r + β_cov·|logp − logp_old|
    both      token-mean (the `loss_agg` knob), group advantage (§1 `group`), K = 4
    defaults  ratio 2e-4 for both, lb 1, ub 5, ε 0.2/0.2, β_cov 0.1 (verl's defaults; the
              paper's 7B recipe uses KL-Cov ratio 2e-3 with β_cov 1, Clip-Cov ε 1.0/1.0)

The selection needs the whole mini-batch, so it is not done inside the loss: the registry entry
declares `select_tokens`, and train.update scores the mini-batch at the current weights (a no-grad
pass; on the first mini-batch the π_old pass itself), lays every rank's tokens out in one order,
and calls `select_clip_cov` / `select_kl_cov` on the same flat tensors on every rank; the loss
reads the result as LossInputs.selected. On the first mini-batch r = 1, so KL-Cov's penalty has
neither value nor gradient (|x| has slope 0 at 0 in torch) and nothing is clipped: K = 4 (our
choice; the paper does not fix it) lets both act off-policy.

Worked example (tests/test_algos_2025.py): response 0 with A = +1 and logp [−0.1, −3.0, −0.5],
response 1 with A = −1 and logp [−0.2, −4.0]; logp_old [−0.2, −2.9, −0.5] and [−0.3, −3.5].
Means A 0.2, logp −1.56 -> cov = [1.168, −1.152, 0.848, −1.632, 2.928]. Clip-Cov: the last token
is clipped by PPO (A < 0, r = e^−0.5 < 0.8), so C = {token 0}, k = 1: token 0 loses its gradient;
loss = 0.0000667 (= (−0.904837 − 1 + 1.105171 + 0.8) / 5, token 0 still counted). KL-Cov, k = 1:
the last token pays 0.1·0.5; loss = −0.2496613517; with ratio 0.4 (k = 2) token 0 pays 0.1·0.1
as well: −0.2476613517.

Where we differ from verl, and why:
- verl takes the means, the candidates and the top-k per micro-batch (and per rank); we take them
  over the whole mini-batch on all ranks (docs/math.md §0), so one mini-batch gives the same update for
  any micro-batch split or number of ranks. The Clip-Cov draw comes from one generator seeded
  alike on every rank, from (seed, the mini-batch's first group id, epoch), for the same reason
  (verl: torch.randperm on each rank's global generator).
- KL-Cov's top-k ranks the valid tokens in one order, response after response (verl: row-major
  over the micro-batch), which only matters for ties.
"""
from __future__ import annotations

import torch

from algos import policy_gradient
from algos.base import Algorithm, Knob, LossInputs

_VERL = dict(adv_norm="group", loss_agg="token-mean", mini_batches=4, weight_decay=0.01)  # actor optimizer default
PRESETS = {
    "clip_cov": dict(clip_low=0.2, clip_high=0.2, clip_cov_ratio=2e-4, clip_cov_lb=1.0, clip_cov_ub=5.0, **_VERL),
    "kl_cov": dict(kl_cov_ratio=2e-4, kl_cov_coef=0.1, **_VERL),
}
_SHARED = (*policy_gradient.ADVANTAGE_KNOBS, *policy_gradient.TURN_CREDIT_KNOBS, policy_gradient.LOSS_AGG,
           *policy_gradient.AGGREGATE_KNOBS)  # neither has a dual clip
CLIP_COV_KNOBS = (
    Knob("clip_cov_ratio", 2e-4, "at most this fraction of the valid tokens loses its gradient", above=0, at_most=1),
    Knob("clip_cov_lb", 1.0, "only tokens with lb < cov(A, logp) < ub are candidates"),
    Knob("clip_cov_ub", 5.0, "upper end of that window"),
    *policy_gradient.CLIP_KNOBS, *_SHARED)
KL_COV_KNOBS = (
    Knob("kl_cov_ratio", 2e-4, "this fraction of the valid tokens, top by cov(A, logp), pays the penalty "
         "(paper 7B: 2e-3)", above=0, at_most=1),
    Knob("kl_cov_coef", 0.1, "β_cov: penalty β_cov·|logp − logp_old| on those tokens (paper 7B: 1)", at_least=0),
    *_SHARED)  # no clip at all


def covariance(adv: torch.Tensor, logp: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """cov per token, centred on the means over the valid tokens (padding gets a value too; ignore it).
    adv [1, 1, −1], logp [−1, −2, −3], all valid -> means 1/3, −2 -> [2/3, 0, 4/3]."""
    if not valid.any():
        return torch.zeros_like(logp)
    return (adv - adv[valid].mean()) * (logp - logp[valid].mean())


def how_many(ratio: float, valid: torch.Tensor) -> int:
    """k = max(⌊ratio · valid tokens⌋, 1). 2e-4 of 12,000 tokens -> 2; of 100 -> 1."""
    return max(int(ratio * int(valid.sum())), 1)


def select_clip_cov(tokens: dict, cfg, generator: torch.Generator) -> torch.Tensor:
    """Bool per token of the whole mini-batch (flat): the tokens whose gradient Clip-Cov removes.
    tokens: logp (current, detached), old_logp, adv, mask, all [N]."""
    valid = tokens["mask"] > 0
    cov = covariance(tokens["adv"], tokens["logp"], valid)
    _, clipped = policy_gradient.clipped_surrogate(tokens["logp"][:, None], tokens["old_logp"][:, None],
                                                   tokens["adv"], clip_low=cfg.clip_low, clip_high=cfg.clip_high)
    candidates = (valid & ~clipped[:, 0] & (cov > cfg.clip_cov_lb) & (cov < cfg.clip_cov_ub)).nonzero()[:, 0]
    k = how_many(cfg.clip_cov_ratio, valid)
    picked = torch.zeros_like(valid)
    picked[candidates[torch.randperm(len(candidates), generator=generator)[:k]]] = True
    return picked


def select_kl_cov(tokens: dict, cfg, generator: torch.Generator | None = None) -> torch.Tensor:
    """Bool per token of the whole mini-batch (flat): the top-k by cov, which pay KL-Cov's penalty."""
    valid = tokens["mask"] > 0
    picked = torch.zeros_like(valid)
    if valid.any():
        where = valid.nonzero()[:, 0]
        cov = covariance(tokens["adv"], tokens["logp"], valid)[where]
        picked[where[torch.topk(cov, min(how_many(cfg.kl_cov_ratio, valid), len(where))).indices]] = True
    return picked


def clip_cov_loss(mb: LossInputs, cfg, totals: dict):
    """PPO clip with the selected tokens' loss set to 0. Reads logp, old_logp, mask, adv, selected (and
    what policy_gradient.aggregate reads)."""
    per_token, clipped = policy_gradient.clipped_surrogate(mb.logp, mb.old_logp, mb.adv,
                                                           clip_low=cfg.clip_low, clip_high=cfg.clip_high)
    kept = ~mb.selected
    metrics = {"pg/clipfrac": policy_gradient.token_share(clipped, mb, totals),
               "cov/selected_frac": policy_gradient.token_share(mb.selected, mb, totals)}
    return policy_gradient.aggregate(per_token * kept, mb, cfg, totals, loss_agg=cfg.loss_agg, metrics=metrics)


def kl_cov_loss(mb: LossInputs, cfg, totals: dict):
    """Unclipped −A·r, plus β_cov·|logp − logp_old| on the selected tokens. Reads as clip_cov_loss."""
    log_ratio = mb.logp - mb.old_logp
    penalty = cfg.kl_cov_coef * log_ratio.abs() * mb.selected
    metrics = {"cov/selected_frac": policy_gradient.token_share(mb.selected, mb, totals),
               "cov/abs_log_ratio": policy_gradient.token_share(log_ratio.abs(), mb, totals)}
    return policy_gradient.aggregate(-mb.adv[:, None] * torch.exp(log_ratio) + penalty, mb, cfg, totals,
                                     loss_agg=cfg.loss_agg, metrics=metrics)


def check_window(cfg) -> str:
    """Clip-Cov's candidate window must not be empty."""
    if cfg.clip_cov_lb < cfg.clip_cov_ub:
        return ""
    return f"clip_cov_lb ({cfg.clip_cov_lb}) must be < clip_cov_ub ({cfg.clip_cov_ub})"


_NO_CLIP = "its −A·r is not clipped"
ALGORITHMS = [
    Algorithm("clip_cov", PRESETS["clip_cov"], policy_gradient.batch_advantages, clip_cov_loss,
              knobs=CLIP_COV_KNOBS, group_baseline=True, check=check_window, select_tokens=select_clip_cov,
              norm=policy_gradient.batch_norm),
    Algorithm("kl_cov", PRESETS["kl_cov"], policy_gradient.batch_advantages, kl_cov_loss, knobs=KL_COV_KNOBS,
              group_baseline=True, select_tokens=select_kl_cov, norm=policy_gradient.batch_norm,
              refuses={"clip_low": _NO_CLIP, "clip_high": _NO_CLIP, "dual_clip": _NO_CLIP}),
]
