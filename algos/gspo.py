"""GSPO: clip the importance ratio of the whole response, not of each token.

docs/math.md §7. Paper: Zheng et al. 2025, "Group Sequence Policy Optimization" (arXiv 2507.18071).
Read from verl `verl/trainer/ppo/core_algos.py` @ b178a3c (compute_policy_loss_gspo) and TRL
`trl/trainer/grpo_trainer.py` @ f2cd577 (importance_sampling_level="sequence").

    sequence ratio  log s_i   = Σ_t m·(logp − logp_old) / max(L_i, 1)     (a geometric mean of r_t)
    per token       log s_i,t = logp − sg(logp) + sg(log s_i), clamped above at 10
                    value s_i on every token; gradient s_i·∇logp_t, the same factor for all of them
    loss            ℓ = max(−A·s_i,t, −A·clip(s_i,t, 1 − ε_low, 1 + ε_high)), no dual clip,
                    seq-mean-token-mean always (global counts, docs/math.md §0)
    defaults        ε_low 3e-4, ε_high 4e-4 (paper §5.1); group advantage (§1 `group`);
                    K = 4 mini-batches per rollout batch (paper §5.1)

On the first mini-batch θ = θ_old, so s = 1 and nothing is clipped: the loss is −mean_i A_i and
∂loss/∂logp_i,t = −A_i / (N·L_i), GRPO's gradient. The clip acts from the 2nd mini-batch on, and
it drops a whole response at once: once s_i leaves [1 − ε_low, 1 + ε_high] on the side its
advantage pushes toward, none of its tokens has a gradient.

Worked example (tests/test_algos_2025.py; docs/math.md §1's logp, logp_old and R = [1, 0, 0, 1], group
A = ±0.8660239): s = [0.983471, 0.904837, 1.051271, 1.016806]; responses 1 (A < 0, s < 1 − ε_low)
and 3 (A > 0, s > 1 + ε_high) are clipped; loss = 0.0145274736.

Where we differ from verl, and why:
- The aggregation is seq-mean-token-mean whatever `loss_agg` says, as in verl (which ignores its
  knob here); GSPO does not declare `loss_agg`, so config.validate refuses another value instead of
  ignoring it silently, and likewise `dual_clip`.
- max_chunks must be 1 and --env unset: a Markovian or multi-turn trace spread over several rows
  would need the whole trace's ratio in every row.
"""
from __future__ import annotations

import torch

from algos import policy_gradient
from algos.base import Algorithm, LossInputs, several_rows

PRESET = dict(adv_norm="group", clip_low=3e-4, clip_high=4e-4, mini_batches=4,
              weight_decay=0.01)  # verl's actor optimizer default
KNOBS = (*policy_gradient.ADVANTAGE_KNOBS, *policy_gradient.CLIP_KNOBS,
         *policy_gradient.AGGREGATE_KNOBS)  # no dual clip, no loss_agg


def sequence_log_ratio(logp, old_logp, mask) -> torch.Tensor:
    """log s_i [n]: the mean log-ratio over each response's valid tokens (0 for an empty row).
    log-ratios [[0.1, -0.2, 0.4]], mask [[1, 1, 0]] -> [-0.05]."""
    return ((logp - old_logp) * mask).sum(1) / mask.sum(1).clamp(min=1)


def loss(mb: LossInputs, cfg, totals: dict):
    """Sequence-level PPO clip, a share of the global seq-mean-token-mean.

    Reads logp, old_logp, mask, adv (and what policy_gradient.aggregate reads).
    """
    logp, mask = mb.logp, mb.mask
    log_s = sequence_log_ratio(logp, mb.old_logp, mask).detach()
    # value s_i everywhere, gradient through each token's own logp (verl clamps at 10 for overflow)
    s = torch.exp((logp - logp.detach() + log_s[:, None]).clamp(max=10.0))
    a = mb.adv[:, None]
    unclipped, clipped = -a * s, -a * s.clamp(1 - cfg.clip_low, 1 + cfg.clip_high)
    metrics = {"pg/clipfrac": policy_gradient.token_share(clipped > unclipped, mb, totals)}
    return policy_gradient.aggregate(torch.maximum(unclipped, clipped), mb, cfg, totals,
                                     loss_agg="seq-mean-token-mean", metrics=metrics)


def check(cfg) -> str:
    """A trace spread over several rows (Markovian, multi-turn) has no whole-response ratio in any one row."""
    if not several_rows(cfg):
        return ""
    return ("--algo gspo clips each response's whole ratio, which a Markovian or multi-turn trace split over rows "
            "does not have in one row: set max_chunks 1, no --env")


ALGORITHMS = [Algorithm("gspo", PRESET, policy_gradient.batch_advantages, loss, knobs=KNOBS, check=check,
                        group_baseline=True,
                        refuses={"loss_agg": "it always aggregates seq-mean-token-mean, as verl does",
                                 "dual_clip": "its sequence ratio is clipped on both sides, without a dual clip"})]
