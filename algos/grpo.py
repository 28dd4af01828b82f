"""GRPO and its family — one clipped policy-gradient loss, six presets of explicit knobs.

docs/math.md §1. Papers: GRPO (DeepSeekMath, arXiv 2402.03300; TRL's GRPOTrainer), DAPO (arXiv
2503.14476), Dr. GRPO ("Understanding R1-Zero-Like Training", arXiv 2503.20783), Lite PPO ("Tricks
or Traps? Part I", arXiv 2508.08221), RLOO ("Back to Basics", arXiv 2402.14740), MaxRL ("Maximum
Likelihood Reinforcement Learning", arXiv 2602.02710; prime-rl's max_rl, docs/math.md §11).

The loss is the shared pieces of algos/policy_gradient.py end to end (the formulas are there): the
advantage by knob `adv_norm`, the PPO clip with an optional dual clip, an optional β·k3 KL to a
reference, and the aggregation by knob `loss_agg` over the whole mini-batch on all ranks.

DAPO's dynamic sampling, overlong penalty and truncation masking act on the batch, not the loss:
they are `train.py` / `rewards.py` knobs that these presets switch on.

The presets carry each recipe's optimizer knobs too: DAPO K = 16, 10 warm-up steps, weight decay
0.1 (verl recipe/dapo run_dapo_qwen2.5_32b.sh; the overlong buffer is a fifth of the budget by
default, 4096 of 20480 there); Dr. GRPO K = 8 and reward 0 for a response without EOS
(`zero_truncated`; sail-sg/understand-r1-zero train_zero_math.py).
Where we differ from the official code, and why:
- DAPO refills with rounds of B prompts (`max_sampling_rounds` extra rounds, default 3); the
  official run generates 1536 prompts a round (3 × its 512) for up to 10 rounds. Smaller rounds
  waste fewer samples when most groups are informative; the kept batch is the same B groups.
- Dr. GRPO's loss normaliser is the response budget (`max_new_tokens`, the official
  generate_max_length); the official code also trains on responses without EOS, as we do.
"""
from __future__ import annotations

from algos import policy_gradient
from algos.base import Algorithm, LossInputs

PRESETS = {
    "grpo": dict(adv_norm="group", clip_low=0.2, clip_high=0.2, loss_agg="seq-mean-token-mean"),
    # DAPO's recipe (verl recipe/dapo run_dapo_qwen2.5_32b.sh): 512 prompts in mini-batches of 32
    # (K = 16), 10 warm-up steps, AdamW weight decay 0.1
    "dapo": dict(adv_norm="group", clip_low=0.2, clip_high=0.28, loss_agg="token-mean",
                 dynamic_sampling=True, overlong_penalty=True, mini_batches=16, warmup_steps=10,
                 weight_decay=0.1),
    # understand-r1-zero (train_zero_math.py): 128 prompts × 8 in batches of 128 responses (K = 8),
    # and a response without EOS gets reward 0
    "dr_grpo": dict(adv_norm="none", clip_low=0.2, clip_high=0.2,
                    loss_agg="seq-mean-token-sum-norm", mini_batches=8, zero_truncated=True),
    "lite_ppo": dict(adv_norm="batch", clip_low=0.2, clip_high=0.2, loss_agg="token-mean"),
    "rloo": dict(adv_norm="rloo", clip_low=0.2, clip_high=0.2, loss_agg="token-mean"),
    # MaxRL (docs/math.md §11): ÷ the group's mean reward; token-mean over the mini-batch, as prime-rl's max_rl
    "maxrl": dict(adv_norm="mean", clip_low=0.2, clip_high=0.2, loss_agg="token-mean"),
}
KNOBS = (*policy_gradient.ADVANTAGE_KNOBS, *policy_gradient.TURN_CREDIT_KNOBS, *policy_gradient.CLIP_KNOBS,
         policy_gradient.DUAL_CLIP, policy_gradient.LOSS_AGG, *policy_gradient.AGGREGATE_KNOBS)


def loss(mb: LossInputs, cfg, totals: dict):
    """Loss of one micro-batch, already divided by the mini-batch's global counts.

    Reads logp, old_logp, mask, adv (and what policy_gradient.aggregate reads). totals: "seqs",
    "tokens" of the whole mini-batch over all ranks; "max_len" the response budget. Returns (loss,
    metrics); each metric is likewise a share of its mini-batch value, so the trainer sums metrics
    over micro-batches and ranks.
    """
    per_token, was_clipped = policy_gradient.clipped_surrogate(
        mb.logp, mb.old_logp, mb.adv, clip_low=cfg.clip_low, clip_high=cfg.clip_high, dual_clip=cfg.dual_clip)
    metrics = {"pg/clipfrac": policy_gradient.token_share(was_clipped, mb, totals)}
    return policy_gradient.aggregate(per_token, mb, cfg, totals, loss_agg=cfg.loss_agg, metrics=metrics)


ALGORITHMS = [Algorithm(name, preset, policy_gradient.batch_advantages, loss, knobs=KNOBS, group_baseline=True,
                        norm=policy_gradient.batch_norm)
              for name, preset in PRESETS.items()]
