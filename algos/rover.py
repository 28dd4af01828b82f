"""ROVER: value the uniform random policy, then act softmax-greedy on those values.

docs/math.md §3. Paper: He et al. 2025, "Random Policy Valuation is Enough for LLM Reasoning with
Verifiable Rewards" (arXiv 2509.24981). Official code: github.com/tinnerhrhe/ROVER @ b0fa587,
`Math/verl/workers/actor/dp_actor.py` (DataParallelROVERActor.update_policy) and
`Math/verl/trainer/ppo/core_algos.py` (compute_rover_loss).

The Q-value of a taken token is the policy's own log-ratio to the policy that sampled it, and the
value of the next state is the mean of Q over the whole vocabulary (a uniform random policy):

    Q[i,t]      = ρ · (logp_θ − logp_old)[i,t] · m[i,t]
    nextV[i,t]  = ρ · (M_θ − M_old)[i,t+1] · m[i,t+1],   0 after the last column
                  M = mean over the vocabulary of log_softmax(z/τ)  (model.py, same chunked pass)
    target      = stop_grad(A_i · m[i,t] + nextV[i,t])   A_i: group-normalised reward (§1 `group`)
    loss        = Σ m · (Q − target)² / (Σ m + 1e-8)     global token-mean (docs/math.md §0)

The gradient flows only through logp_θ of the taken token; M_θ enters the target only. On the
first mini-batch of a rollout batch θ = θ_old, so Q = nextV = 0 and ROVER is unclipped token-mean
REINFORCE with advantage A: the K = 4 mini-batches of the official recipe are what make it ROVER.
Sampling "from the softmax over Q" is ordinary sampling, since π_θ = π_old · exp(Q/ρ).

Where we differ from the official code, and why:
- The official actor takes the token-mean per micro-batch and weights micro-batches by their
  share of sequences; we divide by the valid tokens of the whole mini-batch on all ranks, so the
  gradient does not depend on the micro-batch split. The two agree when a mini-batch is one
  micro-batch.
- With Markovian thinking (`--max-chunks`), each chunk is its own row, so the next-state value
  after a chunk's last token is 0 (the row ends there) although the trace goes on in the next
  chunk: bootstrapping stops at chunk boundaries. The official code has no chunked rollout.
- `rover_adv=mean` gives the paper's (and the official countdown recipe's) A_i = R_i − mean_g R;
  the default `group` is the official math recipe behind the headline table.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from algos import policy_gradient
from algos.base import TOP_ENTROPY_QUANTILE, Algorithm, Knob, LossInputs

PRESET = dict(mini_batches=4, rover_temp=1.0, rover_adv="group", weight_decay=0.01)  # official actor.yaml
ROVER_ADVS = ("group", "mean")
KNOBS = (Knob("rover_temp", 1.0, "ρ: Q = ρ · (logp − logp_old)", above=0),
         Knob("rover_adv", "group", "group (official math recipe) | mean (paper: R − group mean)",
              choices=ROVER_ADVS),
         *policy_gradient.ADVANTAGE_KNOBS[1:],  # std_estimator, adv_eps: the group z-score's
         *policy_gradient.TURN_CREDIT_KNOBS,
         TOP_ENTROPY_QUANTILE)


def norm(cfg) -> dict:
    """policy_gradient.advantages' settings for rover_adv: group (z-score) or mean (R − group mean)."""
    return dict(adv_norm="group" if cfg.rover_adv == "group" else "none", std_estimator=cfg.std_estimator,
                eps=cfg.adv_eps)


def advantages(scores: torch.Tensor, cfg) -> torch.Tensor:
    """[[1, 0, 0, 1]] -> group: [[0.866, −0.866, −0.866, 0.866]]; mean: [[0.5, −0.5, −0.5, 0.5]]."""
    return policy_gradient.advantages(scores, **norm(cfg))


def next_values(vocab_mean, old_vocab_mean, mask, rho: float) -> torch.Tensor:
    """nextV [n, T]: the next state's value, read at t + 1 with the mask at t + 1.

    ΔM = M_θ − M_old = [[0.1, 0.2, 0.3]], mask [[1, 1, 0]], ρ = 1 -> [[0.2, 0, 0]]:
    the value after the last real token (and after the last column) is 0.
    """
    v = rho * (vocab_mean - old_vocab_mean) * mask
    return F.pad(v[:, 1:], (0, 1))


def loss(mb: LossInputs, cfg, totals: dict):
    """Masked squared error of Q against its bootstrapped target, a share of the global token-mean.

    Reads logp, old_logp, vocab_mean, old_vocab_mean, mask, adv; with --top-entropy-quantile only
    the high-entropy tokens' errors count (they all stay in the denominator).
    """
    mask, rho = mb.mask, cfg.rover_temp
    q = rho * (mb.logp - mb.old_logp) * mask
    next_v = next_values(mb.vocab_mean, mb.old_vocab_mean, mask, rho)
    target = (mb.adv[:, None] * mask + next_v).detach()
    n_tokens = totals["tokens"] + 1e-8
    per_token = mask * (q - target) ** 2
    if mb.high_entropy is not None:
        per_token = per_token * mb.high_entropy
    metrics = {"rover/q": q.sum().detach() / n_tokens,
               "rover/next_v": next_v.sum().detach() / n_tokens,
               "rover/q_abs_err": (mask * (q - target).abs()).sum().detach() / n_tokens}
    return per_token.sum() / n_tokens, metrics


ALGORITHMS = [Algorithm("rover", PRESET, advantages, loss, knobs=KNOBS, group_baseline=True, vocab_mean=True, norm=norm,
                        refuses={"beta": "its loss has no KL term, so it loads no reference model",
                                 "loss_agg": "its loss is always the global token-mean"})]
