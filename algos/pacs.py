"""PACS: the policy's own log-ratio is a reward model, trained by classifying correct responses.

docs/math.md §4. Paper: Li et al. 2025, "Implicit Actor Critic Coupling via a Supervised Learning
Framework for RLVR" (arXiv 2509.02522). Official code: github.com/ritzz-ai/PACS @ bbe1dc6,
`src/pacs/pacs_core_algos.py` (compute_pacs_loss, compute_weight) and `src/pacs/pacs_actor.py`.

    score   r̂_i = β · Σ_t m[i,t] · (logp_θ − logp_old)[i,t]        a sum over the response
    logit   ψ_i = r̂_i − mean_{j≠i, same group} r̂_j                 leave-one-out (`pacs_psi`)
    weight  w_i = G / (2 · #{j in the group: R_j = R_i}) if the group has both labels, else 1
    loss    = Σ_i w_i · (softplus(ψ_i) − R_i · ψ_i) / (number of responses)   BCE with logits

R_i ∈ {0, 1} is the verifiable reward (correct = score > 0; LossInputs.labels). The actor is the
critic: raising ψ of a correct response raises its log-probability. On the first mini-batch
θ = θ_old, so ψ = 0 and the loss is ln 2 whatever the labels; its gradient is still informative,
and the K = 4 mini-batches of the official recipe let ψ move away from 0.

ψ and w compare the responses of one group, so train.update keeps every group whole inside a
micro-batch (Algorithm.whole_groups) and micro_batch_size must hold at least one group.

Where we differ from the official code, and why:
- "π_ref" of the paper is, as in the official code, π_old of each rollout batch: no frozen model.
- No gradient clipping, as in the official code: the preset sets grad_clip = 0 (overridable).
- `pacs_psi` also offers the group z-score of r̂ and the raw r̂ (`none`), the paper's ablations.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from algos.base import TOP_ENTROPY_QUANTILE, Algorithm, Knob, LossInputs

PRESET = dict(mini_batches=4, grad_clip=0.0, pacs_beta=1.0, pacs_psi="loo", weight_decay=0.01)  # configs/ppo_trainer.yaml
PACS_PSIS = ("loo", "zscore", "none")
KNOBS = (Knob("pacs_beta", 1.0, "β: score r̂ = β · Σ_t (logp − logp_old) over the response", above=0),
         Knob("pacs_psi", "loo", "r̂ -> logit ψ within the group: loo (leave-one-out) | zscore | none",
              choices=PACS_PSIS),
         TOP_ENTROPY_QUANTILE)


def group_sums(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Per-row sum over the row's group; idx numbers the groups 0, 1, ...
    x [1, 2, 3], idx [0, 0, 1] -> [3, 3, 3]."""
    return torch.zeros(int(idx.max()) + 1, dtype=x.dtype, device=x.device).index_add(0, idx, x)[idx]


def logits(score: torch.Tensor, idx: torch.Tensor, mode: str, eps: float = 1e-6) -> torch.Tensor:
    """ψ from r̂ within each group. score [0.1, 0.2, 0.6], one group, "loo" -> [−0.3, −0.15, 0.45]."""
    n = group_sums(torch.ones_like(score), idx)
    others = (n - 1).clamp(min=1)  # a group of one compares with nothing: ψ = r̂
    if mode == "loo":  # mean of the other n − 1 scores of the group
        return score - (group_sums(score, idx) - score) / others
    if mode == "zscore":
        mean = group_sums(score, idx) / n
        std = (group_sums((score - mean) ** 2, idx) / others).sqrt()
        return (score - mean) / (std + eps)
    return score


def class_weights(labels: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Balance the two labels inside each group; a one-label group keeps weight 1.

    labels [1, 0, 0, 0] (one group) -> [2, 2/3, 2/3, 2/3]; labels [1, 1] -> [1, 1].
    """
    n = group_sums(torch.ones_like(labels), idx)
    n_pos = group_sums(labels, idx)
    same = torch.where(labels > 0, n_pos, n - n_pos)
    mixed = (n_pos > 0) & (n_pos < n)
    return torch.where(mixed, n / (2 * same), torch.ones_like(labels))


def loss(mb: LossInputs, cfg, totals: dict):
    """Class-balanced BCE of ψ against the labels, a share of the mean over the mini-batch's responses.

    Reads logp, old_logp, mask, labels, group; whole groups only. ψ is a sum over the response, not
    a per-token loss, so --top-entropy-quantile detaches the other tokens' logp instead of masking.
    """
    logp = mb.logp if mb.high_entropy is None else torch.where(mb.high_entropy, mb.logp, mb.logp.detach())
    labels = mb.labels.float()
    _, idx = torch.unique(mb.group, return_inverse=True)  # group ids -> 0, 1, ...
    score = cfg.pacs_beta * (mb.mask * (logp - mb.old_logp)).sum(1)
    psi = logits(score, idx, cfg.pacs_psi)
    w = class_weights(labels, idx)
    n_seqs = max(totals["seqs"], 1)
    total = (w * (F.softplus(psi) - labels * psi)).sum() / n_seqs
    metrics = {"pacs/psi_abs": psi.abs().sum().detach() / n_seqs,
               "pacs/critic_acc": ((psi > 0) == (labels > 0)).float().sum() / n_seqs}
    return total, metrics


# no advantage: the label R_i (1 = correct, LossInputs.labels) takes its place
ALGORITHMS = [Algorithm("pacs", PRESET, None, loss, knobs=KNOBS, whole_groups=True,
                        refuses={"beta": "its β is pacs_beta; it has no KL term to a reference model"})]
