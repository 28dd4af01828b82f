"""The pieces the policy-gradient losses of algos/ share, with the knobs that set them.

GRPO (algos/grpo.py) is these pieces end to end; the other losses take some of them and bring
their own for the rest. docs/math.md §1 has the formulas, §0 the global counts.

    advantages         A_i from the rewards of the group (or the batch), knob `adv_norm`:
                       group (R_i − mean_g R) / (std_g R + eps) | batch: the std of the whole batch |
                       none: R_i − mean_g R | rloo: R_i − the mean of the other G − 1 |
                       mean (MaxRL): (R_i − mean_g R) / mean_g R, 0 where mean_g R ≤ 0
    clipped_surrogate  ℓ = max(−A·r, −A·clip(r, 1 − ε_low, 1 + ε_high)),  r = exp(logp − logp_old)
                       optional dual clip c (A < 0: ℓ ← min(ℓ, −c·A))
    k3_kl              k3 = e^(ref − θ) − (ref − θ) − 1 ≥ 0 per token, the KL to a frozen reference
    aggregate          ℓ ← ℓ + β·k3 when β > 0, then Σ w·ℓ with the weights of knob `loss_agg`
                       (token_weights), always normalised by counts of the whole mini-batch on all ranks
"""
from __future__ import annotations

import torch

from algos.base import TOP_ENTROPY_QUANTILE, Knob, LossInputs

ADV_NORMS = ("group", "batch", "none", "rloo", "mean")
LOSS_AGGS = ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm")

# The knobs, in the groups the losses share: batch_advantages reads ADVANTAGE_KNOBS, a PPO clip
# CLIP_KNOBS (and DUAL_CLIP where it has one), and aggregate (the tail of every per-token policy
# loss) AGGREGATE_KNOBS, plus LOSS_AGG where the loss does not fix its aggregation.
ADVANTAGE_KNOBS = (
    Knob("adv_norm", "group", "group | batch (Lite PPO) | none (Dr. GRPO) | rloo | mean (MaxRL)", choices=ADV_NORMS),
    Knob("std_estimator", "unbiased", "unbiased (n − 1, TRL/verl) | population", choices=("unbiased", "population")),
    Knob("adv_eps", 1e-6, "added to the std before dividing", at_least=0))
# read by every algorithm whose advantage a turn credit rule can apply to each turn (Algorithm.norm)
TURN_CREDIT_KNOBS = (
    Knob("turn_credit", "outcome", "how a multi-turn trace's rewards become its turns' advantages (docs/math.md "
         "§8): outcome (its return's, every turn) | return (each turn's discounted return-to-go, normalised "
         "among its group's traces at that turn) | mt_grpo (the outcome's + λ × the turn rewards' from that "
         "turn on)", choices=("outcome", "return", "mt_grpo")),
    Knob("turn_gamma", 1.0, "γ: --turn-credit return's discount per turn", above=0, at_most=1),
    Knob("turn_adv_coef", 1.0, "λ: --turn-credit mt_grpo's weight of the turn advantages (MT-GRPO's "
         "turn_advantage_coef)", at_least=0))
CLIP_KNOBS = (
    Knob("clip_low", 0.2, "ε_low: ratio clipped below at 1 − ε_low", at_least=0),
    Knob("clip_high", 0.2, "ε_high: ratio clipped above at 1 + ε_high (DAPO clip-higher 0.28)", at_least=0))
DUAL_CLIP = Knob("dual_clip", 0.0, "c > 1 caps the loss of negative-advantage tokens at −c·A; 0 = off",
                 above=1, off=0.0)
LOSS_AGG = Knob("loss_agg", "seq-mean-token-mean", "seq-mean-token-mean | token-mean | seq-mean-token-sum-norm "
                "(L = the response budget)", choices=LOSS_AGGS)
AGGREGATE_KNOBS = (
    Knob("beta", 0.0, "k3 KL weight to a frozen reference; 0 loads no reference model", at_least=0),
    Knob("tis_cap", 0.0, "truncated IS on the sampler/trainer ratio: PG loss × min(π_old/π_sampler, cap) per "
         "token; 0 = off (Delethink: 2)", at_least=1, off=0.0),
    Knob("mis_cap", 0.0, "masked IS: tokens whose π_old/π_sampler is over cap or under 1/cap get weight 0; "
         "0 = off", above=1, off=0.0),
    TOP_ENTROPY_QUANTILE)


def advantages(scores: torch.Tensor, *, adv_norm: str, std_estimator: str = "unbiased",
               eps: float = 1e-6) -> torch.Tensor:
    """Per-response advantages from the rewards of whole groups, scores [n_groups, G] -> same shape.

    [[1, 0, 0, 1]] with adv_norm="group" -> [[0.866, -0.866, -0.866, 0.866]] (unbiased std);
    "rloo" -> [[2/3, -2/3, -2/3, 2/3]]; "none" -> [[0.5, -0.5, -0.5, 0.5]]; "mean" -> [[1, -1, -1, 1]].
    """
    g = scores.shape[1]
    unbiased = std_estimator == "unbiased"
    if adv_norm == "rloo":
        # mean of the *other* G − 1 rewards: (sum − R_i) / (G − 1)
        return scores - (scores.sum(1, keepdim=True) - scores) / (g - 1)
    # verl/TRL convention: a group of one has mean 0 and std 1
    mean = scores.mean(1, keepdim=True) if g > 1 else torch.zeros_like(scores)
    centred = scores - mean
    if adv_norm == "none":  # Dr. GRPO: no std division
        return centred
    if adv_norm == "group":
        std = scores.std(1, keepdim=True, unbiased=unbiased) if g > 1 else torch.ones_like(scores)
    elif adv_norm == "batch":  # Lite PPO: group mean, std of the whole (global) batch
        std = scores.flatten().std(unbiased=unbiased) if scores.numel() > 1 else scores.new_ones(())
    elif adv_norm == "mean":  # MaxRL: no eps; a group whose mean is ≤ 0 (never solved) gets advantage 0
        return torch.where(mean > 0, centred / torch.where(mean > 0, mean, 1.0), 0.0)
    else:
        raise ValueError(f"adv_norm={adv_norm!r}: choose one of {', '.join(ADV_NORMS)}")
    return centred / (std + eps)


def token_weights(mask: torch.Tensor, *, loss_agg: str, n_seqs: int, n_tokens: int,
                  max_len: int, seq_tokens: torch.Tensor | None = None) -> torch.Tensor:
    """Weights w [N, T] with loss = Σ w·ℓ; n_seqs and n_tokens count the whole mini-batch on all
    ranks (docs/math.md §0), so micro-batches and ranks just add their Σ w·ℓ. seq_tokens [N]: the tokens
    of each row's whole response, when a row is only part of one (a chunk of a Markovian trace,
    docs/math.md §5: then a trace's tokens are averaged over all its chunks); default mask.sum(1).

    mask [[1, 1, 0], [1, 1, 1]], n_seqs 2, n_tokens 5:
      "token-mean"          -> every valid token 1/5
      "seq-mean-token-mean" -> row 0: 1/(2·2), row 1: 1/(2·3)
      "seq-mean-token-sum-norm", max_len 4 -> every valid token 1/(2·4)
    """
    if loss_agg == "token-mean":
        return mask / max(n_tokens, 1)
    if loss_agg == "seq-mean-token-mean":
        lengths = mask.sum(1) if seq_tokens is None else seq_tokens.to(mask.dtype)
        return mask / lengths[:, None].clamp(min=1) / max(n_seqs, 1)
    if loss_agg == "seq-mean-token-sum-norm":  # Dr. GRPO: a constant length, not each row's
        return mask / (max(n_seqs, 1) * max_len)
    raise ValueError(f"loss_agg={loss_agg!r}: choose one of {', '.join(LOSS_AGGS)}")


def clipped_surrogate(logp, old_logp, adv, *, clip_low: float, clip_high: float, dual_clip: float = 0.0):
    """PPO-clip per-token loss ℓ [N, T] and a bool [N, T] of where the clip took the gradient away; adv is
    per response [N], broadcast over tokens, or per token [N, T] (OPD). At K = μ = 1 (the default) the ratio
    is exactly 1 and the clip does nothing (pg/clipfrac 0); it acts when --epochs or --mini-batches move the
    policy before the last pass."""
    ratio = torch.exp(logp - old_logp)
    a = adv if adv.dim() == 2 else adv[:, None]
    unclipped = -a * ratio
    clipped = -a * ratio.clamp(1 - clip_low, 1 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    was_clipped = clipped > unclipped
    if dual_clip > 0:  # cap the loss of negative-advantage tokens whose ratio exploded
        capped = torch.minimum(loss, -dual_clip * a)
        was_clipped |= (a < 0) & (capped < loss)
        loss = torch.where(a < 0, capped, loss)
    return loss, was_clipped


def k3_kl(logp, ref_logp):
    """Schulman's k3 estimator of KL(π_θ ‖ π_ref) per token: e^(ref − θ) − (ref − θ) − 1 ≥ 0."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1


def aggregate(per_token: torch.Tensor, mb: LossInputs, cfg, totals: dict, *, loss_agg: str,
              metrics: dict, kl_weight: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """The tail every per-token policy loss shares (docs/math.md §1's, §2's and §7's): a surrogate
    ℓ [n, T] -> Σ w·ℓ over the micro-batch, a share of the mini-batch's loss, in this order:
        ℓ ← ℓ · high_entropy  with --top-entropy-quantile: only the high-entropy tokens carry the
                            policy loss; the others stay in w's denominator (algos/high_entropy.py)
        ℓ ← ℓ · is_weight   when train.update supplies it (sampler/trainer importance weights,
                            rollout.sampler_correction): the policy term only, as verl applies
                            rollout_is_weights to pg_losses before it adds anything else
        ℓ ← ℓ + β · k3      the KL to a frozen reference, only when cfg.beta > 0 (k3 × kl_weight if given)
        loss = Σ w · ℓ      w from token_weights: the counts of the whole mini-batch on all ranks
    Returns the loss and `metrics` with "pg/loss" (and "kl/k3") added.

    ℓ [[1, 2, 0]], mask [[1, 1, 0]], "token-mean" over 4 tokens of the mini-batch -> (1 + 2) / 4.
    """
    w = token_weights(mb.mask, loss_agg=loss_agg, n_seqs=totals["seqs"], n_tokens=totals["tokens"],
                      max_len=totals["max_len"], seq_tokens=mb.seq_tokens)
    if mb.high_entropy is not None:
        per_token = per_token * mb.high_entropy
    if mb.is_weight is not None:
        per_token = per_token * mb.is_weight
    metrics = {"pg/loss": (w * per_token).sum().detach(), **metrics}
    if cfg.beta > 0:  # not weighted: the reference KL is a regulariser, not a sampled estimate
        kl = k3_kl(mb.logp, mb.ref_logp)
        if kl_weight is not None:
            kl = kl * kl_weight
        metrics["kl/k3"] = (mb.mask * kl).sum().detach() / max(totals["tokens"], 1)
        per_token = per_token + cfg.beta * kl
    return (w * per_token).sum(), metrics


def token_share(x: torch.Tensor, mb: LossInputs, totals: dict) -> torch.Tensor:
    """The micro-batch's share of the token-mean of x over the mini-batch's valid tokens (of a flag:
    the fraction where it holds). x [[1, 0, 1]], mask [[1, 1, 0]], 4 valid tokens in all -> 1/4."""
    return (mb.mask * x).sum().detach() / max(totals["tokens"], 1)


def batch_norm(cfg) -> dict:
    """advantages' settings as the run's ADVANTAGE_KNOBS set them (an Algorithm.norm)."""
    return dict(adv_norm=cfg.adv_norm, std_estimator=cfg.std_estimator, eps=cfg.adv_eps)


def batch_advantages(scores: torch.Tensor, cfg) -> torch.Tensor:
    """advantages as the run's ADVANTAGE_KNOBS set them: an Algorithm.advantages (GRPO's and others')."""
    return advantages(scores, **batch_norm(cfg))
